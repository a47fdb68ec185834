"""The paper's downstream suite as lm-eval tasks over local files (for machines with no Hub).

``build_local_tasks(source_dir, out_dir)`` converts benchmark records in their upstream layouts
(PIQA, Winogrande, ARC-Easy/Challenge, HellaSwag, CommonsenseQA, SIQA, MMLU, OpenBookQA, TriviaQA,
GSM8K, each in a folder of its name: what ``python -m eval.fetch_benchmarks DIR`` writes from the
Hub once, for machines without it) into jsonl files and writes one lm-eval task YAML per
benchmark (``dataset_path: json`` with ``data_files``), loadable through
``TaskManager(include_path=out_dir)``.

Each local task ``local_X`` is lm-eval's own task ``X`` (``lm_eval/tasks``, lm-eval 0.4.13) on
the same records: the converters render lm-eval's prompt (``doc_to_text``, including its
``process_docs``), choices and target into the fields ``query``, ``choices`` and ``gold``
(``answers``/``answer`` for the generative tasks), and the YAML carries lm-eval's target and
few-shot delimiters, splits, generation arguments, filters and metrics. The upstream files are
read the way the Hugging Face datasets lm-eval loads were built from them (the same splits, record
order and stripped fields), so the requests a model sees are lm-eval's, string for string, and so
are its scores (``tests/test_local_tasks_match_lm_eval.py``). Where they differ, and why:

* MMLU: one task over every subject found, not lm-eval's group of 57 per-subject tasks. Each
  question keeps its subject's description (``description: "{{description}}"``), so the zero-shot
  requests are identical, and its ``acc`` is the mean over all questions, which is what lm-eval's
  ``mmlu`` group reports (``weight_by_size: true`` at both levels). Its ``num_fewshot`` is pinned to
  0: lm-eval's few-shot examples are the first ones of the question's own subject's ``dev`` split,
  which one task over all subjects cannot draw, so ``--num_fewshot`` is ignored for it (lm-eval logs
  that) rather than answered with other subjects' examples. The paper's setting is zero-shot.
* GSM8K: the 5-shot examples are drawn, with lm-eval's sampler and seed, from the local
  ``train.jsonl``: lm-eval's examples when it is the whole published train split (as
  ``eval.fetch_benchmarks`` writes it). The paper's table takes the first ``exact_match`` lm-eval
  reports, ``strict-match``, as for lm-eval's own task.

Numbers over a subset of a benchmark's records (excerpts, ``--limit``) are comparable with the
paper's only in their definition, not in their value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from eval.benchmark_records import (
    BENCHMARK_FOLDERS,
    TASK_FOLDERS,
    Splits,
    arc,
    commonsense_qa,
    gsm8k,
    hellaswag,
    mmlu,
    openbookqa,
    piqa,
    siqa,
    triviaqa,
    winogrande,
)


def _metric(name: str, **kwargs) -> dict:
    return {"metric": name, "aggregation": "mean", "higher_is_better": True, **kwargs}


ACC, ACC_NORM = _metric("acc"), _metric("acc_norm")
MULTIPLE_CHOICE = {
    "output_type": "multiple_choice",
    "doc_to_text": "query",
    "doc_to_choice": "choices",
    "doc_to_target": "gold",
}
GENERATE = {"output_type": "generate_until", "doc_to_text": "query"}

# lm-eval's triviaqa: the answer the model generates (" Paris", the space is the continuation's)
# is stripped before the exact match, and the first of the filtered answers is scored
TRIVIAQA = {
    **GENERATE,
    "doc_to_target": "answers",
    "target_delimiter": " ",
    "generation_kwargs": {"until": ["\n", ".", ","], "do_sample": False, "temperature": 0.0},
    "filter_list": [
        {
            "name": "remove_whitespace",
            "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}],
        }
    ],
    "metric_list": [_metric("exact_match", ignore_case=True, ignore_punctuation=True)],
    "metadata": {"version": 3.0},
}


def _last_number(name: str) -> dict:
    regex = {
        "function": "regex",
        "group_select": -1,
        "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)",
    }
    return {"name": name, "filter": [regex, {"function": "take_first"}]}


GSM8K = {
    **GENERATE,
    "doc_to_target": "answer",
    "fewshot_split": "train",
    "metric_list": [
        _metric(
            "exact_match",
            ignore_case=True,
            ignore_punctuation=False,
            regexes_to_ignore=[",", "\\$", "(?s).*#### ", "\\.$"],
        )
    ],
    "generation_kwargs": {
        "until": ["Question:", "</s>", "<|im_end|>"],
        "do_sample": False,
        "temperature": 0.0,
    },
    "repeats": 1,
    "num_fewshot": 5,
    "filter_list": [
        {
            "name": "strict-match",
            "filter": [
                {"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
                {"function": "take_first"},
            ],
        },
        _last_number("flexible-extract"),
    ],
    "metadata": {"version": 3.0},
}

# name -> (converter to {split: rows}, the YAML keys besides the task, data and split names)
TASKS: dict[str, tuple[Callable[[Path], Splits], dict]] = {
    "piqa": (
        piqa,
        {**MULTIPLE_CHOICE, "metric_list": [ACC, ACC_NORM], "metadata": {"version": 1.0}},
    ),
    "winogrande": (
        winogrande,
        {
            **MULTIPLE_CHOICE,
            "doc_to_text": "gold",
            "doc_to_target": "target",
            "metric_list": [ACC],
            "metadata": {"version": 1.0},
        },
    ),
    "arc_easy": (
        lambda r: arc(r, "ARC-Easy"),
        {**MULTIPLE_CHOICE, "metric_list": [ACC, ACC_NORM], "metadata": {"version": 1.0}},
    ),
    "arc_challenge": (
        lambda r: arc(r, "ARC-Challenge"),
        {**MULTIPLE_CHOICE, "metric_list": [ACC, ACC_NORM], "metadata": {"version": 1.0}},
    ),
    "hellaswag": (
        hellaswag,
        {**MULTIPLE_CHOICE, "metric_list": [ACC, ACC_NORM], "metadata": {"version": 1.0}},
    ),
    "commonsense_qa": (commonsense_qa, {**MULTIPLE_CHOICE, "metric_list": [ACC]}),
    "social_iqa": (
        siqa,
        {
            **MULTIPLE_CHOICE,
            "target_delimiter": " ",
            "metric_list": [ACC],
            "metadata": {"version": 0.0},
        },
    ),
    "mmlu": (
        mmlu,
        {
            **MULTIPLE_CHOICE,
            "description": "{{description}}",
            "num_fewshot": 0,
            "metric_list": [ACC],
            "metadata": {"version": 1.0},
        },
    ),
    "openbookqa": (
        openbookqa,
        {**MULTIPLE_CHOICE, "metric_list": [ACC, ACC_NORM], "metadata": {"version": 1.0}},
    ),
    "triviaqa": (triviaqa, TRIVIAQA),
    "gsm8k": (gsm8k, GSM8K),
}

SPLIT_KEYS = {"train": "training_split", "validation": "validation_split", "test": "test_split"}
FETCH = "python -m eval.fetch_benchmarks"


def missing_source(source: str | Path) -> str | None:
    """Why ``source`` cannot hold the local suite (no such directory, or no benchmark folder
    in it), naming the command that writes one; None when it can."""
    path = Path(source)
    if not path.is_dir():
        return f"no directory {source}: write the benchmarks there once with `{FETCH} {source}`"
    if not any((path / folder).is_dir() for folder in BENCHMARK_FOLDERS):
        return (
            f"{source} holds none of the benchmark folders ({', '.join(BENCHMARK_FOLDERS)}): "
            f"write them once with `{FETCH} {source}`"
        )
    return None


def missing_tasks(source: str | Path, tasks: list[str]) -> str | None:
    """Why ``source`` cannot serve ``tasks`` (``missing_source``, a task the local suite does
    not have, or a task whose folder is absent), cheaply, from the folders alone: what a run
    checks before it writes anything; None when it can."""
    why = missing_source(source)
    if why:
        return why
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        return f"the local suite has no task {', '.join(unknown)}; its tasks: {', '.join(TASKS)}"
    absent = [t for t in tasks if not (Path(source) / TASK_FOLDERS[t]).is_dir()]
    if absent:
        benchmarks = " ".join(sorted({TASK_FOLDERS[t].split("/")[0] for t in absent}))
        return (
            f"{source} has no files for {', '.join(absent)}: write them with "
            f"`{FETCH} {source} --only {benchmarks}`"
        )
    return None


def build_local_tasks(source: str | Path, out_dir: str | Path) -> list[str]:
    """Write jsonl data and task YAMLs for every benchmark found; return the task names.

    The evaluated split (lm-eval's: ``test`` where the task has one, else ``validation``) is
    ``<name>.jsonl``, a training split ``<name>.train.jsonl``; a benchmark whose evaluated split,
    or few-shot split (GSM8K's ``train``), has no records is left out. A ``source`` that is no
    directory, or holds no benchmark folder, is refused (``missing_source``)."""
    why = missing_source(source)
    if why:
        raise FileNotFoundError(why)
    root, out_dir = Path(source), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for name, (convert, keys) in TASKS.items():
        found = convert(root)
        evaluated = "test" if "test" in found else "validation"
        splits = {split: rows for split, rows in found.items() if rows}
        if evaluated not in splits or keys.get("fewshot_split", evaluated) not in splits:
            continue
        data_files = {}
        for split, rows in splits.items():
            suffix = "" if split == evaluated else f".{split}"
            path = out_dir / f"{name}{suffix}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            data_files[split] = str(path)
        config = {
            "task": f"local_{name}",
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": data_files},
            **{SPLIT_KEYS[s]: s for s in splits},
            **keys,
        }
        (out_dir / f"local_{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        names.append(f"local_{name}")
    return names
