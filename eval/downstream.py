"""Downstream accuracy of a run through lm-evaluation-harness, printed like the paper's table.

    python -m eval.downstream runs/paper_3b-xielu                       # the paper's suite (Hub)
    python -m eval.fetch_benchmarks /path/to/benchmarks    # once, where the Hub is reachable
    python -m eval.downstream RUN --suite local --local-data /path/to/benchmarks   # offline
    python -m eval.downstream RUN --tasks piqa hellaswag --limit 200
    python -m eval.downstream RUN --device cpu --batch-size 32      # default: the GPU if present

The model is the project's own (``eval/harness.py``), so every activation can be evaluated,
exportable to transformers or not. The aggregate is the unweighted mean of the rows, as in the
paper's table; ARC is the mean of ARC-Easy and ARC-Challenge.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

# paper row -> [(lm-eval task, metric)], averaged within the row
PAPER_SUITE = {
    "PIQA": [("piqa", "acc")],
    "Winogrande": [("winogrande", "acc")],
    "ARC": [("arc_easy", "acc_norm"), ("arc_challenge", "acc_norm")],
    "HellaSwag": [("hellaswag", "acc_norm")],
    "CommonsenseQA": [("commonsense_qa", "acc")],
    "SIQA": [("social_iqa", "acc")],
    "MMLU": [("mmlu", "acc")],
    "OpenBookQA": [("openbookqa", "acc_norm")],
    "TriviaQA": [("triviaqa", "exact_match")],
    "GSM8k": [("gsm8k", "exact_match")],
}


def suite(local: bool) -> dict[str, list[tuple[str, str]]]:
    if not local:
        return PAPER_SUITE
    return {row: [(f"local_{t}", m) for t, m in tasks] for row, tasks in PAPER_SUITE.items()}


def metric_value(results: dict, task: str, metric: str) -> float | None:
    entry = results.get(task)
    if entry is None:
        return None
    for key, value in entry.items():  # lm-eval keys metrics as "acc,none", "exact_match,filter"
        if key.split(",")[0] == metric and isinstance(value, int | float):
            return float(value)
    return None


def table(results: dict, rows: dict[str, list[tuple[str, str]]]) -> tuple[list[str], float | None]:
    lines = ["| benchmark | accuracy |", "|---|---|"]
    scores = []
    for row, tasks in rows.items():
        values = [metric_value(results, t, m) for t, m in tasks]
        values = [v for v in values if v is not None]
        if not values:
            continue
        score = 100 * sum(values) / len(values)
        scores.append(score)
        lines.append(f"| {row} | {score:.1f} |")
    aggregate = sum(scores) / len(scores) if scores else None
    if aggregate is not None:
        lines.append(f"| Aggregate Score | {aggregate:.1f} |")
    return lines, aggregate


def evaluate(
    run_dir: str,
    tasks: list[str],
    include_path: str | None,
    limit: int | None,
    batch_size: int,
    step: int | None = None,
    device: str = "cpu",
) -> dict:
    """lm-eval's results for ``tasks`` on the run's checkpoint (the newest unless ``step``),
    run on ``device`` ``batch_size`` requests at a time."""
    from lm_eval.tasks import TaskManager

    from data import load_tokenizer
    from eval.harness import ProjectLM
    from training.checkpoint import load_trained_model

    model, config, _ = load_trained_model(run_dir, step, device)
    tokenizer = load_tokenizer(config.data.tokenizer)
    lm = ProjectLM(model, tokenizer, batch_size, device, add_bos=config.data.tokenizer.add_bos)
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    return lm_eval_results(lm, tasks, manager, limit)["results"]


def lm_eval_results(lm, tasks: list[str], manager, limit: int | None) -> dict | None:
    """lm-eval's ``simple_evaluate`` output on rank 0 (None on the others), without the report
    of the environment it adds on rank 0: torch's ``collect_env`` and ``pip list``, about 3.7 s
    of CPU at every call, while in training the other ranks wait at their next collective.
    Only the scores are kept, here and in training."""
    from lm_eval import evaluator

    report = evaluator.add_env_info
    evaluator.add_env_info = lambda results: None
    try:
        return evaluator.simple_evaluate(
            model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=False
        )
    finally:
        evaluator.add_env_info = report


def during_training(
    model,
    tokenizer,
    tasks: list[str],
    limit: int | None,
    data_dir: str,
    task_dir: Path,
    env,
    add_bos: bool = False,
    batch_size: int = 8,
) -> dict[str, float] | None:
    """lm-eval on the model being trained (the trainer's ``downstream.every``): every
    rank scores its share of the documents and rank 0 gets the metrics, as
    ``downstream/<task>/<metric>`` (lm-eval's filter dropped where it is ``none``); the other
    ranks get None. With ``data_dir`` (upstream benchmark files) the local copies of the tasks
    are built once into ``task_dir`` and used offline. ``model`` is the bare model (under
    FSDP2 its forwards gather the shards); the caller puts it back in training mode."""
    from lm_eval.tasks import TaskManager

    from eval.harness import ProjectLM
    from training.runtime import distributed

    include_path = None
    if data_dir:
        include_path = str(task_dir)
        if env.is_main and not task_dir.is_dir():
            from eval.local_tasks import build_local_tasks

            build_local_tasks(data_dir, task_dir)
        distributed.barrier()
        tasks = [f"local_{name}" for name in tasks]
        missing = [t for t in tasks if not (task_dir / f"{t}.yaml").is_file()]
        if missing:
            raise FileNotFoundError(
                f"downstream.data={data_dir} has no records for "
                f"{', '.join(t.removeprefix('local_') for t in missing)}: write them with "
                f"`python -m eval.fetch_benchmarks {data_dir}`"
            )
    lm = ProjectLM(model, tokenizer, batch_size, str(env.device), add_bos=add_bos)
    if include_path:
        manager = TaskManager(include_path=include_path, include_defaults=False)
    else:
        manager = TaskManager()
    output = lm_eval_results(lm, tasks, manager, limit)
    if output is None:
        return None
    flat = {}
    for task, entry in output["results"].items():
        for key, value in entry.items():
            if "stderr" in key or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            metric, _, filter_name = key.partition(",")
            name = metric if filter_name in ("", "none") else f"{metric}_{filter_name}"
            flat[f"downstream/{task}/{name}"] = float(value)
    return flat


class InTraining:
    """What ``train.py`` hands the trainer for ``downstream.every``: a call is
    :func:`during_training`, and ``check`` is what the trainer asks of
    ``downstream.data`` before it writes anything (a missing directory, or one without
    the files of a task the run names, would otherwise end the run at its first evaluation)."""

    def __call__(self, *args, **kwargs) -> dict[str, float] | None:
        return during_training(*args, **kwargs)

    def check(self, data_dir: str, tasks: list[str]) -> str | None:
        from eval.local_tasks import missing_tasks

        return missing_tasks(data_dir, list(tasks)) if data_dir else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    parser.add_argument("--suite", choices=["paper", "local"], default="paper")
    parser.add_argument(
        "--local-data",
        metavar="DIR",
        help="with --suite local: the benchmarks' files, as python -m eval.fetch_benchmarks "
        "DIR writes them",
    )
    parser.add_argument("--tasks", nargs="*", help="lm-eval task names instead of the suite")
    parser.add_argument("--limit", type=int, help="documents per task")
    parser.add_argument("--batch-size", type=int, default=8, help="requests per forward")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="default: cuda when there is a GPU, else cpu",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    if args.suite == "local":
        from eval.local_tasks import FETCH, missing_source

        if not args.local_data:
            parser.error(
                f"--suite local needs --local-data DIR, the benchmarks' files: write them once "
                f"with `{FETCH} DIR` where the Hub is reachable"
            )
        why = missing_source(args.local_data)
        if why:
            parser.error(f"--local-data: {why}")

    rows = suite(args.suite == "local")
    with tempfile.TemporaryDirectory() as tmp:
        include = None
        if args.suite == "local":
            from eval.local_tasks import build_local_tasks

            available = set(build_local_tasks(args.local_data, tmp))
            include = tmp
            rows = {r: [(t, m) for t, m in ts if t in available] for r, ts in rows.items()}
        tasks = args.tasks or sorted({t for ts in rows.values() for t, _ in ts})
        started = time.perf_counter()
        results = evaluate(
            args.run_dir, tasks, include, args.limit, args.batch_size, args.step, args.device
        )
        seconds = time.perf_counter() - started
    lines, aggregate = table(results, rows)
    print("\n".join(lines))
    score = "no aggregate" if aggregate is None else f"aggregate {aggregate:.1f}"
    print(f"{args.run_dir}: {len(tasks)} task(s), {score}, in {seconds:.0f} s on {args.device}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return {"results": results, "aggregate": aggregate}


if __name__ == "__main__":
    main()
