"""The inputs that used to run silently wrong, write where they should not, or end in a
traceback: each is refused by name before anything is written, or said aloud.

A start is refused when ``train.py``'s run (``run_in_process``: the same config and checks) raises
the error ``train.py`` prints as ``invalid configuration: ...`` (``ConfigError``, or
``ValueError`` from a settings dataclass), naming the key, and the run directory was never made.
"""

from __future__ import annotations

import logging
import re

import pytest

from train_helpers import compose, run_in_process, tiny_overrides
from training.errors import ConfigError

REFUSED = (ConfigError, ValueError)


def refused(corpus, tmp_path, message: str, **settings) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(REFUSED, match=message):
        run_in_process(tiny_overrides(corpus, run_dir, **settings))
    assert not run_dir.exists()


def test_data_paths_on_a_source_that_reads_none_is_refused_naming_data_local(corpus, tmp_path):
    """``python train.py data.paths=[...]`` without ``data=local`` trained on the builtin
    corpus, exit 0, its config.yaml recording ``source: builtin`` beside the paths."""
    refused(
        corpus,
        tmp_path,
        r"data\.paths: data\.source=builtin reads no data\.paths .*data=local",
        **{"data": "builtin"},
    )


def test_an_empty_run_directory_is_refused_rather_than_the_current_one(
    corpus, tmp_path, monkeypatch
):
    """``trainer.run_dir=`` wrote checkpoints/, config.yaml and metrics.jsonl into the current
    directory (the repository root), and the next call resumed from there."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"trainer\.run_dir is empty"):
        run_in_process([*tiny_overrides(corpus, tmp_path / "run"), "trainer.run_dir="])
    assert list(tmp_path.iterdir()) == []


def test_a_run_directory_that_is_a_file_is_refused_before_the_model_is_built(corpus, tmp_path):
    """It ended in ``FileExistsError`` once the model was built."""
    taken = tmp_path / "run"
    taken.write_text("a file")
    with pytest.raises(ConfigError, match=rf"trainer\.run_dir={taken} is a file"):
        run_in_process(tiny_overrides(corpus, taken))
    assert taken.read_text() == "a file"


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"optim.name": "muon", "optim.weight_decay": 100},
            r"optim\.weight_decay=100.* x optim\.muon\.lr=0\.02 = 2",
        ),
        ({"optim.weight_decay": 500}, r"optim\.weight_decay=500 x optim\.lr=0\.002 = 1:"),
    ],
)
def test_a_decay_that_flips_or_zeroes_the_weights_each_step_is_refused(
    corpus, tmp_path, settings, message
):
    """Decoupled decay multiplies a weight by 1 - rate x decay each step: at a product of 1 or
    more it zeroes or flips every weight (Muon's matrices by -1 at 0.02 x 100); decay was only
    checked >= 0. The rule, written out: refused exactly when rate x decay >= 1."""
    refused(corpus, tmp_path, message, **settings)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"+model.activation_kwargs.backend": "bogus"}, r"model\.activation_kwargs.*'bogus'"),
        (
            {"model.activation": "relu2", "+model.activation_kwargs.backend": "traced"},
            r"model\.activation_kwargs.*backend",
        ),
        ({"+model.activation_kwargs.alpha_p_init": 0}, r"model\.activation_kwargs.*alpha_p_init"),
        ({"+model.activation_kwargs.foo": 1}, r"model\.activation_kwargs.*foo"),
        ({"+model.activation_kwargs.beta": "abc"}, r"model\.activation_kwargs.*beta"),
    ],
)
def test_activation_options_are_checked_with_the_models_settings(
    corpus, tmp_path, settings, message
):
    """Each ended in a traceback from building the model, not in a refusal."""
    with pytest.raises(ValueError, match=message):
        compose(tiny_overrides(corpus, tmp_path / "run", **settings))


def test_an_unknown_xielu_backend_in_the_environment_is_refused_naming_the_variable(
    corpus, tmp_path, monkeypatch
):
    monkeypatch.setenv("XIELU_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"XIELU_BACKEND='bogus'.*environment"):
        compose(tiny_overrides(corpus, tmp_path / "run"))


def test_a_goldfish_modulus_past_int64_is_refused_before_any_write(corpus, tmp_path):
    """``loss.goldfish_k=10**21`` with the paper's rule: OverflowError at step 1, after the run
    directory was written (the ids' hash is an int64 taken modulo k)."""
    refused(
        corpus,
        tmp_path,
        r"loss\.goldfish_k=1000000000000000000000 .*2\*\*63",
        **{"loss.goldfish_k": 10**21, "loss.goldfish_h": 4, "loss.goldfish_rule": "paper"},
    )


@pytest.mark.parametrize(
    "settings, unread",
    [
        (
            {"optim.name": "muon", "optim.ademamix.alpha": 5.0, "optim.ademamix.beta3": 0.99},
            ["optim.ademamix.alpha", "optim.ademamix.beta3"],
        ),
        ({"optim.name": "adamw", "optim.muon.lr": 0.05}, ["optim.muon.lr"]),
        ({"loss.goldfish_h": 3}, ["loss.goldfish_h"]),
    ],
)
def test_a_setting_nothing_reads_is_named_at_the_start(corpus, tmp_path, caplog, settings, unread):
    """AdEMAMix's settings left under ``optim.name=muon`` (``recipe=apertus`` sets them) were
    ignored without a word. One rule for every setting read only while another turns its part
    on (``training.checks.READ_ONLY_WHEN``): set away from its default while the part is off,
    it is named in a warning at the start."""
    short = {"trainer.steps": 2, "validation.every": 0, "checkpoint.every": 0}
    short.update({"schedule.warmup_steps": 1, "schedule.decay_steps": 1})
    with caplog.at_level(logging.WARNING):
        assert run_in_process(tiny_overrides(corpus, tmp_path / "run", **short, **settings)) == 0
    said = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert len(said) == 1 and all(key in said[0] for key in unread), said


def test_a_ramp_stage_past_the_runs_last_token_is_named(corpus, tmp_path, caplog):
    # 12 steps x 4 sequences x 32 tokens = 1536 tokens: a stage at 10**6 is never reached
    settings = {"trainer.batch_ramp": "[{tokens: 1000000, global_batch: 8}]"}
    with caplog.at_level(logging.WARNING):
        assert run_in_process(tiny_overrides(corpus, tmp_path / "run", **settings)) == 0
    assert any(
        "trainer.batch_ramp" in r.getMessage() and "1536" in r.getMessage() for r in caplog.records
    )


def test_the_decay_rule_refuses_a_product_of_one_and_not_one_below():
    from training.muon import MuonConfig
    from training.optim import OptimConfig

    OptimConfig(lr=0.002, weight_decay=499)  # 0.998: shrinks, as decay does
    with pytest.raises(ConfigError, match=r"= 1:"):
        OptimConfig(lr=0.002, weight_decay=500)
    OptimConfig(name="adamw", muon=MuonConfig(lr=1.0), weight_decay=10, lr=0.01)  # no Muon


@pytest.mark.slow
def test_no_checkpoint_is_published_from_a_step_whose_loss_was_not_finite(corpus, tmp_path, caplog):
    """``optim.name=muon optim.muon.lr=1e6``: every loss after the first updates was NaN, yet
    step 6's checkpoint was published, and resuming it with a sane rate hit NaN at once. Here
    the losses of steps 3 to 5 are made NaN (``tests/faults.py``) under Muon, a checkpoint due
    at every step: the kept checkpoints are those of the finite steps 1 and 2, and the
    refusal names Muon's rate, not only ``optim.lr``."""
    from faults import fault_components
    from train_helpers import metrics

    run_dir = tmp_path / "run"
    settings = {
        "optim.name": "muon",
        "checkpoint.every": 1,
        "checkpoint.keep": 10,
        "spikes.max_bad_steps": 3,
    }
    overrides = tiny_overrides(corpus, run_dir, **settings)
    assert run_in_process(overrides, fault_components(nan_steps=[2, 3, 4])) == 3
    assert "Lower optim.muon.lr (Muon's matrices) or optim.lr" in caplog.text
    losses = {m["step"]: m["loss"] for m in metrics(run_dir) if "loss" in m}
    # step 5, the third in a row, stops the run before its line is logged
    assert [step for step, loss in losses.items() if loss != loss] == [3, 4]
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_000001", "step_000002"]


@pytest.mark.parametrize(
    "flag, message",
    [
        (["--gpus", "0"], r"--gpus must be a positive number of GPUs, got 0"),
        (["--gpus", "-4"], r"--gpus must be a positive number of GPUs, got -4"),
        (["--mfu", "0"], r"--mfu must lie in \(0, 1\], got 0\.0"),
        (["--mfu", "nan"], r"--mfu must lie in \(0, 1\], got nan"),
        (["--peak", "inf"], r"--peak must be a positive finite FLOP/s, got inf"),
    ],
)
def test_estimate_sweep_refuses_a_price_that_cannot_be(flag, message, capsys):
    """``--gpus 0`` / ``--mfu 0``: ZeroDivisionError; ``--mfu nan`` a table of nan;
    ``--gpus -4`` "-0.0 hours on -4 GPU(s)"."""
    from scripts.estimate_sweep import main

    with pytest.raises(SystemExit):
        main(["mini_ablation", *flag])
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.slow
def test_a_checkpoint_of_another_optimizer_is_refused_naming_the_optimizer(corpus, tmp_path):
    """AdamW to Muon with ``trainer.allow_changes=[optim.name]``: the refusal printed a literal
    backslash-n and said "most often the model differs" when the optimizer's state did."""
    from training.errors import IncompatibleCheckpointError

    overrides = tiny_overrides(
        corpus, tmp_path / "run", **{"trainer.steps": 4, "schedule.decay_steps": 1}
    )
    assert run_in_process(overrides) == 0
    other = [*overrides, "optim.name=muon", "trainer.allow_changes=[optim.name]"]
    with pytest.raises(IncompatibleCheckpointError) as refusal:
        run_in_process(other)
    message = str(refusal.value)
    assert "\\n" not in message and "\nNothing was changed." in message
    assert "The optimizer's state differs from the run's (optim.name" in message
    assert "Most often the model" not in message


@pytest.mark.slow
def test_a_resume_may_change_the_activations_kernel_as_it_may_the_attentions(corpus, tmp_path):
    """``model.activation_kwargs.backend`` (even to ``auto``, the default) was refused as a
    model change while ``XIELU_BACKEND`` switched it freely: the kernel is not the model."""
    overrides = tiny_overrides(
        corpus, tmp_path / "run", **{"trainer.steps": 4, "schedule.decay_steps": 1}
    )
    assert run_in_process(overrides) == 0
    resumed = [*overrides, "trainer.steps=6", "+model.activation_kwargs.backend=auto"]
    assert run_in_process(resumed) == 0
    refused_change = [*overrides, "trainer.steps=8", "+model.activation_kwargs.alpha_p_init=0.5"]
    with pytest.raises(
        ConfigError, match=r"allow_changes=\[model\.activation_kwargs\.alpha_p_init\]"
    ):
        run_in_process(refused_change)
    # the escape the refusal names works, for the option alone or for every option
    for steps, value, allowed in (
        (8, 0.5, "model.activation_kwargs.alpha_p_init"),
        (10, 0.25, "model.activation_kwargs"),
    ):
        change = [*overrides, f"trainer.steps={steps}"]
        change += [f"+model.activation_kwargs.alpha_p_init={value}"]
        assert run_in_process([*change, f"trainer.allow_changes=[{allowed}]"]) == 0


def test_fp8_on_a_cpu_says_first_that_it_needs_a_gpu():
    """It asked for ``parallel.precision=bf16`` first, then, that done, said it needs a GPU."""
    import torch

    from training.runtime.float8 import refusal, torchao_available

    if not torchao_available():
        pytest.skip("torchao is not installed: that refusal comes first")
    why = refusal("tensorwise", "fp32", torch.device("cpu"))
    assert "needs a CUDA GPU" in why and "precision" not in why


def test_a_dry_run_refuses_jobs_that_would_share_a_run_directory(monkeypatch):
    """``scripts.sweep --dry-run`` printed the jobs the real launch refuses."""
    from scripts import sweep as sweep_script

    same = {
        "grids": [
            {"overrides": ["experiment=study", "trainer.run_dir=runs/shared"], "sweep": {}},
            {"overrides": ["experiment=study", "trainer.run_dir=runs/shared"], "sweep": {}},
        ]
    }
    monkeypatch.setattr(sweep_script, "load_sweep", lambda name: same)
    with pytest.raises(SystemExit, match="two jobs would train in runs/shared"):
        sweep_script.main(["synthetic", "--dry-run", "--launcher", "basic"])


def test_the_sweeps_help_names_every_shipped_sweep(capsys):
    """It listed 3 of the 27."""
    from scripts import sweep as sweep_script
    from training.sweeps import SWEEPS

    with pytest.raises(SystemExit):
        sweep_script.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for path in SWEEPS.glob("*.yaml"):
        assert path.stem in shown, path.stem


def test_the_optimizer_report_on_runs_it_cannot_read_says_why(tmp_path, capsys):
    """Runs with no selection run at the base width printed empty tables, exit 0 (runs at two
    rates each: a second stage's one rate would be read, ``test_optimizer_report.py``)."""
    from test_width_report import fake_run

    from scripts.study import optimizer_report

    runs = [
        fake_run(tmp_path, a, "mup", 128, lr, 1, 2.0)
        for a in ("relu2", "xielu")
        for lr in (3e-3, 6e-3)
    ]
    with pytest.raises(SystemExit, match=r"--base 64.*--selection-seed 0.*widths 128.*seeds 1"):
        optimizer_report.main([str(r) for r in runs])
    assert "## Rates" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_muon_run_logs_muons_rate_beside_the_schedules(corpus, tmp_path):
    from train_helpers import metrics

    run_dir = tmp_path / "run"
    settings = {"optim.name": "muon", "optim.lr": 0.002, "optim.muon.lr": 0.04}
    assert run_in_process(tiny_overrides(corpus, run_dir, **settings)) == 0
    steps = [m for m in metrics(run_dir) if "loss" in m]
    assert all(m["muon_lr"] == pytest.approx(m["lr"] * 0.04 / 0.002) for m in steps)
    assert max(m["muon_lr"] for m in steps) == pytest.approx(0.04)


def test_a_mixtures_closing_summary_gives_each_sources_loss_and_says_per_source(tmp_path):
    """metrics.jsonl held ``val/loss/<source>``; the closing lines gave only the total, and
    said "batches per rank" where the batches are per source and rank."""
    from data.config import MixtureSource
    from training.config import ExperimentConfig
    from training.summary import validation_lines

    config = ExperimentConfig()
    config.validation.batches = 2
    config.data.sources = [
        MixtureSource(name="c4", source="builtin", weight=0.5),
        MixtureSource(name="wiki", source="builtin", weight=0.5),
    ]
    record = {
        "val/loss": 2.5,
        "val/tokens": 3000,
        "val/loss/c4": 2.75,
        "val/tokens/c4": 1000,
        "val/loss/wiki": 2.375,
        "val/tokens/wiki": 2000,
    }
    text = " ".join(validation_lines(record, config, tmp_path))
    assert "batches per source and rank" in text
    assert "c4 2.750 (1,000 tokens)" in text and "wiki 2.375 (2,000 tokens)" in text


@pytest.mark.slow
def test_an_unreadable_parquet_file_is_named_once(tmp_path, caplog):
    """ "skipping unreadable parquet" was printed three times per file in a run (once per
    reader of the file list: the held-out slice, the training stream, validation)."""
    from data_fixtures import write_parquet_corpus

    corpus = tmp_path / "corpus"
    write_parquet_corpus(corpus, files=2)
    (corpus / "part_009.parquet").write_bytes(b"not parquet")
    short = {"trainer.steps": 4, "schedule.decay_steps": 1, "validation.every": 2}
    with caplog.at_level(logging.WARNING):
        assert run_in_process(tiny_overrides(corpus, tmp_path / "run", **short)) == 0
    said = [r for r in caplog.records if "part_009.parquet" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


@pytest.mark.slow
def test_a_non_finite_last_step_ends_the_run_unfinished(corpus, tmp_path):
    """Its checkpoint is not written (the rule above), so the run is not finished: exit 3, and
    a sweep, which looks for the last step's checkpoint, runs it again rather than skip it."""
    from faults import fault_components

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(corpus, run_dir, **{"trainer.steps": 6, "schedule.decay_steps": 2})
    assert run_in_process(overrides, fault_components(nan_steps=[5])) == 3
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000004"]
