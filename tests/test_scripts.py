"""The scripts package: runnable as modules and as files, and the helpers the scripts share."""

import ast
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from eval.runs import read_metrics
from scripts.common import markdown, saved_bytes
from train_helpers import ROOT

SHARED = {"scripts.common", "scripts.figures"}


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.stem)
def test_scripts_import_the_shared_helpers_never_one_another(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    own = {name for name in imported if name == "scripts" or name.startswith("scripts.")}
    assert own <= SHARED, f"{path.name} imports {sorted(own - SHARED)}: share through common"


@pytest.mark.slow
@pytest.mark.parametrize(
    "command,cwd",
    [
        (["-m", "scripts.results_table"], ROOT),
        # a file run from elsewhere finds ``scripts.common`` through the installed package
        ([str(ROOT / "scripts" / "results_table.py")], None),
    ],
    ids=["module", "file"],
)
def test_a_script_that_imports_the_shared_helpers_runs_as_module_and_as_file(
    command, cwd, tmp_path
):
    out = subprocess.run(
        [sys.executable, *command, "--help"],
        cwd=cwd or tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--ablation" in out


def test_read_metrics_keeps_the_later_record_of_a_step_logged_twice(tmp_path):
    records = [
        {"step": 1, "loss": 5.0},
        {"step": 2, "loss": 4.0},
        {"step": 2, "val/loss": 4.5},
        {"step": 2, "loss": 3.9},  # logged again after a resume from step 1
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_metrics(tmp_path) == [records[0], records[3], records[2]]
    with pytest.raises(FileNotFoundError, match=r"has no metrics\.jsonl"):
        read_metrics(tmp_path / "missing")


def test_saved_bytes_counts_a_tensor_saved_by_two_ops_once():
    x = torch.randn(4, 8, requires_grad=True)
    # mul saves x as both of its inputs, exp saves its own output: two tensors of x's size
    assert saved_bytes(lambda: (x * x).exp()) == 2 * x.numel() * x.element_size()


def test_markdown_table_has_a_separator_per_column():
    assert markdown(["a", "b"], [["1", "2"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |"]


def test_checkpoint_benchmark_saves_the_same_state_both_ways(capsys):
    from scripts.bench.checkpoint import main

    rows = main(["--repeats", "1", "--vocab-size", "256"])
    assert [r["mode"] for r in rows] == ["sync", "async"]
    assert rows[0]["gib"] == rows[1]["gib"] > 0
    assert all(r["write_s"] >= r["stall_s"] > 0 for r in rows)  # published after save returns
    assert "| async |" in capsys.readouterr().out


def test_median_ms_divides_a_sample_of_back_to_back_calls_by_their_number(monkeypatch):
    """On a clock that only the timed function moves: 1 warmup call, 1 call timed alone (2 ms,
    so a 40 ms sample holds 20 calls), then 3 samples of 20 calls at 2, 5 and 3 ms each."""
    import scripts.common
    from scripts.common import median_ms

    durations = [7.0, 2.0] + [2.0] * 20 + [5.0] * 20 + [3.0] * 20
    clock = SimpleNamespace(now=0.0, calls=0)

    def call() -> None:
        clock.now += durations[clock.calls] / 1e3
        clock.calls += 1

    monkeypatch.setattr(scripts.common, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    ms = median_ms(call, torch.device("cpu"), warmup=1, repeats=3, min_sample_ms=40)
    assert ms == pytest.approx(3.0)  # the median sample, per call
    assert clock.calls == len(durations)


def test_kernel_tuning_picks_per_dtype_the_least_total_over_both_kinds():
    from scripts.bench.tune_kernels import Timing, best_configs

    timings = [
        Timing("bfloat16", "xielu", "a", 1.0, True),
        Timing("bfloat16", "xiprelu", "a", 1.0, True),  # a: 2.0 in all
        Timing("bfloat16", "xielu", "b", 0.6, True),
        Timing("bfloat16", "xiprelu", "b", 1.3, True),  # b: 1.9, the least
        Timing("bfloat16", "xielu", "c", 0.1, False),  # fastest but not deterministic
        Timing("bfloat16", "xiprelu", "c", 0.1, True),
        Timing("float32", "xielu", "d", 0.1, True),  # d: xiprelu not measured
        Timing("float32", "xielu", "e", 2.0, True),
        Timing("float32", "xiprelu", "e", 2.0, True),
    ]
    assert best_configs(timings) == {"bfloat16": "b", "float32": "e"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_kernel_tuning_without_a_gpu_says_it_needs_one():
    from scripts.bench.tune_kernels import main

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main([])


def test_mutation_testing_picks_the_mutants_of_the_module_or_function_asked_for(monkeypatch):
    from scripts import mutation

    text = """training/step.py:
    training.step.x_train_step__mutmut_1: not checked
    training.step.x_token_weights__mutmut_2: killed
training/step_health.py:
    training.step_health.xǁStepHealthǁsettle__mutmut_3: survived
"""
    statuses = mutation.mutant_statuses(text)
    assert mutation.mutant_names(statuses, "training.step") == [
        "training.step.x_train_step__mutmut_1",
        "training.step.x_token_weights__mutmut_2",
    ]
    assert mutation.mutant_names(statuses, "training.step.x_token_weights") == [
        "training.step.x_token_weights__mutmut_2"
    ]
    monkeypatch.setattr(mutation, "generate", lambda: statuses)
    with pytest.raises(SystemExit, match=r"no mutant of 'model\.loss': is its file in"):
        mutation.main(["model.loss", "tests/test_loss.py"])
