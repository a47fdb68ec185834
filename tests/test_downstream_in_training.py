"""lm-eval during training: every rank's share, the same numbers as evaluating the checkpoint."""

import pytest

from benchmark_fixtures import benchmark_files
from train_helpers import metrics, run, run_in_process, tiny_overrides

pytestmark = pytest.mark.slow

TASKS = ["piqa", "arc_easy"]


def _overrides(corpus, run_dir, **extra):
    return tiny_overrides(
        corpus,
        run_dir,
        **{
            "downstream.every": 6,
            "downstream.tasks": f"[{','.join(TASKS)}]",
            "downstream.limit": 6,
            "downstream.data": str(benchmark_files()),
            "model.max_seq_len": 256,  # room for the tasks' prompts
            **extra,
        },
    )


def _logged(run_dir) -> dict[int, dict[str, float]]:
    return {
        m["step"]: {k: v for k, v in m.items() if k.startswith("downstream/")}
        for m in metrics(run_dir)
        if "downstream/seconds" in m
    }


def _offline(run_dir, step, tasks=TASKS) -> dict[str, float]:
    """The same tasks on the step's checkpoint through python -m eval.downstream's path."""
    from eval.downstream import evaluate
    from eval.local_tasks import build_local_tasks

    include = run_dir / "offline_tasks"
    build_local_tasks(benchmark_files(), include)
    results = evaluate(str(run_dir), [f"local_{t}" for t in tasks], str(include), 6, 2, step)
    return {
        f"downstream/{t}/{k.split(',')[0]}": v
        for t, e in results.items()
        for k, v in e.items()
        if "stderr" not in k and isinstance(v, float)
    }


def test_the_trainer_logs_lm_evals_scores_of_the_model_it_is_training(
    corpus, tmp_path, monkeypatch
):
    """With compiled blocks too: the requests' many shapes run eagerly, none compiled. And
    lm-eval's report of the environment (``pip list``, torch's ``collect_env``) is not made."""
    import torch
    from lm_eval import evaluator
    from torch._dynamo.utils import counters

    import eval.downstream

    reports = []
    monkeypatch.setattr(evaluator, "add_env_info", reports.append)

    compiled_during = []
    evaluate = eval.downstream.during_training

    def counting(*args, **kwargs):
        before = counters["frames"]["total"]
        result = evaluate(*args, **kwargs)
        compiled_during.append(counters["frames"]["total"] - before)
        return result

    monkeypatch.setattr(eval.downstream, "during_training", counting)
    overrides = _overrides(corpus, tmp_path, **{"parallel.compile": "blocks"})
    with torch.compiler.set_stance("default", force_backend="aot_eager"):  # as the tier runs
        assert run_in_process(overrides) == 0
    assert compiled_during == [0, 0]
    assert reports == [] and evaluator.add_env_info == reports.append  # put back after each
    logged = _logged(tmp_path)
    assert sorted(logged) == [6, 12]
    final = {k: v for k, v in logged[12].items() if k.endswith(("/acc", "/acc_norm"))}
    assert {"downstream/local_piqa/acc", "downstream/local_arc_easy/acc_norm"} <= final.keys()
    assert logged[12]["downstream/seconds"] > 0
    assert final == pytest.approx(_offline(tmp_path, 12), abs=1e-12)


def test_two_fsdp2_ranks_each_score_a_share_generation_included_and_report_the_whole(
    corpus, tmp_path
):
    """Under FSDP2 every forward is a collective, and a generation stops when it stops: the
    adapter keeps the ranks' forwards in step (tests/test_harness_ranks.py)."""
    tasks = [*TASKS, "triviaqa"]
    extra = {
        "data.num_workers": 1,
        "parallel.strategy": "fsdp",
        "downstream.tasks": f"[{','.join(tasks)}]",
    }
    code, output = run(_overrides(corpus, tmp_path, **extra), ranks=2, timeout=300)
    assert code == 0, output[-3000:]
    logged = _logged(tmp_path)[12]
    offline = _offline(tmp_path, 12, tasks)
    final = {k: v for k, v in logged.items() if k.endswith(("/acc", "/acc_norm"))}
    assert final == pytest.approx(
        {k: v for k, v in offline.items() if k.endswith(("/acc", "/acc_norm"))}, abs=1e-12
    )
    exact = "downstream/local_triviaqa/exact_match"
    assert logged[f"{exact}_remove_whitespace"] == pytest.approx(offline[exact], abs=1e-12)
