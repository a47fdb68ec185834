"""A µP ladder's rates come from its tuning sweep's runs at the base width, and the basic
launcher runs a sweep in time slices (``eval/tuning.py``, ``scripts/sweep.py``)."""

import json
import math
import signal
import textwrap
import types

import pytest
import yaml

from eval import tuning as tuned_rates
from scripts import sweep as sweep_script
from train_helpers import SWEEP_DATA, SWEEP_POINTS
from training.checkpoint.layout import checkpoint_root, step_dir_name
from training.sweeps import expand, load_sweep, resolve

# the rate each activation's fake tuning runs make best (one per activation, all different)
BEST = {"relu2": 3e-3, "swiglu": 6e-3, "xielu": 1.2e-2, "xiprelu": 1.5e-3}
ACTIVATIONS = tuple(BEST)


def _write_run(run_dir, config, final=None, diverged=False):
    """What a tuning run leaves: its config and, when it ended, its metrics."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "name": config.name,
                "model": {
                    "dim": config.model.dim,
                    "n_heads": config.model.n_heads,
                    "gated_hidden": config.model.gated_hidden,
                    "activation": config.model.activation,
                    "parametrization": config.model.parametrization,
                    "mup_base_dim": config.model.mup_base_dim,
                },
                "data": {"tokenizer": {"name": "bytes"}},
                "optim": {
                    "name": config.optim.name,
                    "lr": config.optim.lr,
                    "muon_lr": config.optim.muon.lr,
                },
                "trainer": {"steps": config.trainer.steps, "seed": config.trainer.seed},
            }
        )
    )
    if diverged:
        records = [{"step": 1, "loss": float("nan")}]
    else:
        records = [{"step": config.trainer.steps, "val/loss": final}]
    (run_dir / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")


def _tune(tmp_path, monkeypatch, skip=None):
    """Fake finished runs for width_lr's µP jobs at the base width (all but ``skip``)."""
    monkeypatch.setattr(tuned_rates, "ROOT", tmp_path)
    for job in expand(load_sweep("width_lr"), SWEEP_DATA):
        config = resolve(job)
        if config.model.parametrization != "mup" or config.model.dim != 64:
            continue
        lr, activation = config.optim.lr, config.model.activation
        if (activation, lr) == skip:
            continue
        loss = 2.0 + abs(lr - BEST[activation]) * 10
        _write_run(tmp_path / config.trainer.run_dir, config, loss, diverged=lr == 2.4e-2)


@pytest.mark.slow  # composes the 166 jobs of two sweeps (about 10 s)
@pytest.mark.xdist_group(SWEEP_POINTS)
def test_the_ladder_trains_each_activation_at_its_base_width_rate(tmp_path, monkeypatch):
    _tune(tmp_path, monkeypatch)
    ladder = load_sweep("width_ladder")
    rates = tuned_rates.tuned_rates(ladder, SWEEP_DATA)
    assert rates == {(a, "adamw"): {"optim.lr": lr} for a, lr in BEST.items()}
    jobs = expand(tuned_rates.with_tuned_rates(ladder, rates, SWEEP_DATA), SWEEP_DATA)
    configs = [resolve(job) for job in jobs]
    assert len(configs) == 4 * 4 * 3  # activations x widths x seeds, as the file says
    for config in configs:
        assert config.optim.lr == BEST[config.model.activation]
        assert config.model.parametrization == "mup" and config.model.mup_base_dim == 64
        assert config.trainer.seed in (1, 2, 3)  # never the seed the rates were picked on
    assert {c.model.dim for c in configs} == {32, 64, 128, 256}
    assert len({c.trainer.run_dir for c in configs}) == len(jobs)


@pytest.mark.slow
@pytest.mark.xdist_group(SWEEP_POINTS)
def test_a_missing_tuning_run_stops_the_ladder_and_says_what_to_run(tmp_path, monkeypatch):
    _tune(tmp_path, monkeypatch, skip=("xielu", 6e-3))
    with pytest.raises(SystemExit) as stop:
        tuned_rates.tuned_rates(load_sweep("width_ladder"), SWEEP_DATA)
    message = str(stop.value)
    assert "1 of its runs have not finished" in message
    assert "xielu" in message and "lr-0.006" in message
    assert "python -m scripts.sweep width_lr" in message


@pytest.mark.slow  # composes the 166 jobs of two sweeps, as the test above
@pytest.mark.xdist_group(SWEEP_POINTS)
def test_a_diverged_tuning_run_is_the_worst_rate_not_a_missing_one(tmp_path, monkeypatch):
    _tune(tmp_path, monkeypatch)  # every 2.4e-2 run diverged
    rates = tuned_rates.tuned_rates(load_sweep("width_ladder"), SWEEP_DATA)
    assert 2.4e-2 not in {rate["optim.lr"] for rate in rates.values()}


# optimizers_gh200_tune's best rates per (activation, optimizer), all from its grids: under
# Muon the pair of its own rate and its AdamW part's optim.lr
BEST_UNDER = {
    **{
        (a, "adamw"): {"optim.lr": lr}
        for a, lr in zip(ACTIVATIONS, (1e-3, 2e-3, 2e-3, 4e-3), strict=True)
    },
    **{
        (a, "ademamix"): {"optim.lr": lr}
        for a, lr in zip(ACTIVATIONS, (5e-4, 2.5e-4, 1e-3, 5e-4), strict=True)
    },
    **{
        (a, "muon"): {"optim.muon.lr": muon, "optim.lr": lr}
        for a, muon, lr in zip(
            ACTIVATIONS, (0.04, 0.02, 0.08, 0.01), (1e-3, 2e-3, 5e-4, 1e-3), strict=True
        )
    },
}


@pytest.mark.slow  # composes the 116 jobs of two sweeps
@pytest.mark.xdist_group(SWEEP_POINTS)
def test_each_optimizer_takes_its_own_rates_from_its_own_tuning_runs(tmp_path, monkeypatch):
    """Under Muon the ladder carries the best pair, ``optim.muon.lr`` and its AdamW part's
    ``optim.lr``, which the tuning grid varies together; under AdamW and AdEMAMix ``optim.lr``."""
    monkeypatch.setattr(tuned_rates, "ROOT", tmp_path)
    for job in expand(load_sweep("optimizers_gh200_tune"), SWEEP_DATA):
        config = resolve(job)
        arm = (config.model.activation, config.optim.name)
        # a bowl around the best rates, each axis in factors of 2
        tried = {"optim.lr": config.optim.lr, "optim.muon.lr": config.optim.muon.lr}
        loss = 2.0 + sum(abs(math.log2(tried[k] / v)) for k, v in BEST_UNDER[arm].items())
        _write_run(tmp_path / config.trainer.run_dir, config, loss)
    ladder = load_sweep("optimizers_gh200")
    rates = tuned_rates.tuned_rates(ladder, SWEEP_DATA)
    assert rates == BEST_UNDER
    jobs = expand(tuned_rates.with_tuned_rates(ladder, rates, SWEEP_DATA), SWEEP_DATA)
    configs = [resolve(job) for job in jobs]
    assert len(configs) == 4 * 3 * 3  # activations x optimizers x seeds
    for c in configs:
        best = BEST_UNDER[(c.model.activation, c.optim.name)]
        assert c.optim.lr == best["optim.lr"]
        if c.optim.name == "muon":
            assert c.optim.muon.lr == best["optim.muon.lr"]
    assert len({c.trainer.run_dir for c in configs}) == len(jobs)


def test_a_muon_tuning_grid_at_one_adamw_rate_leaves_the_ladders_own():
    """Where the tuning runs hold optim.lr fixed, only Muon's rate is carried: the ladder keeps
    the AdamW part's rate its grid sets."""
    sweep = {
        "tuned_by": "t",
        "grids": [
            {
                "overrides": ["experiment=width", "optim.name=muon", "optim.lr=0.002"],
                "sweep": {"activation": ["xielu"]},
            }
        ],
    }
    split = tuned_rates.with_tuned_rates(sweep, {("xielu", "muon"): {"optim.muon.lr": 0.04}})
    (grid,) = split["grids"]
    assert grid["overrides"] == [
        "experiment=width",
        "optim.name=muon",
        "optim.lr=0.002",
        "activation=xielu",
        "optim.muon.lr=0.04",
    ]
    both = tuned_rates.with_tuned_rates(
        sweep, {("xielu", "muon"): {"optim.muon.lr": 0.04, "optim.lr": 0.008}}
    )
    assert both["grids"][0]["overrides"][-3:] == [
        "activation=xielu",
        "optim.muon.lr=0.04",
        "optim.lr=0.008",
    ]
    assert "optim.lr=0.002" not in both["grids"][0]["overrides"]
    sweep["grids"][0]["sweep"]["optim.lr"] = [0.001, 0.002]  # a grid over a rate it is given
    with pytest.raises(SystemExit, match=r"varies optim\.lr that its tuned_by sweep sets"):
        tuned_rates.with_tuned_rates(
            sweep, {("xielu", "muon"): {"optim.muon.lr": 0.04, "optim.lr": 0.008}}
        )


def test_a_finished_job_is_one_whose_last_checkpoint_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_script, "ROOT", tmp_path)
    (job,) = expand(load_sweep("study_lr"))[:1]
    config = resolve(job)
    assert not sweep_script.finished(job)
    final = checkpoint_root(tmp_path / config.trainer.run_dir) / step_dir_name(config.trainer.steps)
    final.parent.mkdir(parents=True)
    (final.parent / step_dir_name(config.trainer.steps - 1)).mkdir()
    assert not sweep_script.finished(job)  # an earlier step is a run to resume
    final.mkdir()
    assert sweep_script.finished(job)


# A stand-in for train.py: runs until SIGTERM, then "checkpoints" (writes a file) and exits 75,
# as the trainer's preemption path does; a job whose argument says so finishes at once.
FAKE_TRAINER = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    name = sys.argv[1]
    if name == "quick":
        sys.exit(0)
    def stop(*_):
        pathlib.Path(name + ".stopped").write_text("checkpointed")
        sys.exit(75)
    signal.signal(signal.SIGTERM, stop)
    pathlib.Path(name + ".started").write_text("")
    while True:
        time.sleep(0.05)
    """
)


@pytest.mark.slow
def test_a_time_slice_stops_the_running_jobs_through_their_checkpoint(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(FAKE_TRAINER)
    monkeypatch.setattr(sweep_script, "ROOT", tmp_path)
    monkeypatch.setattr(sweep_script, "finished", lambda job: job == ["done"])
    jobs = [["done"], ["quick"], ["slow"], ["never"]]
    code = sweep_script.run_locally("slice", jobs, parallel=1, stop_after_min=0.05)
    assert code == 75  # stopped at the limit, not failed: EX_TEMPFAIL, the next slice resumes
    assert (tmp_path / "slow.stopped").read_text() == "checkpointed"
    assert not (tmp_path / "never.started").exists()  # nothing new starts after the limit
    assert not (tmp_path / "done.started").exists()  # a finished job is skipped


@pytest.mark.slow
def test_side_by_side_jobs_log_to_a_file_named_after_their_run_directory(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("import sys; print('trained', sys.argv[1])")
    monkeypatch.setattr(sweep_script, "ROOT", tmp_path)
    monkeypatch.setattr(sweep_script, "finished", lambda job: False)
    monkeypatch.setattr(
        sweep_script,
        "resolve",
        lambda job: types.SimpleNamespace(
            trainer=types.SimpleNamespace(run_dir=f"runs/x-{job[0]}")
        ),
    )
    for _ in range(2):  # a second call (a resume, another --only slice) appends
        assert sweep_script.run_locally("logs", [["a"], ["b"]], parallel=2) == 0
    logs = tmp_path / "runs" / "sweep-logs"
    assert sorted(p.name for p in logs.iterdir()) == ["x-a.log", "x-b.log"]
    assert (logs / "x-b.log").read_text() == "trained b\n" * 2


@pytest.mark.slow
def test_a_job_that_fails_on_its_own_still_fails_the_sweep(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("import sys; sys.exit(3)")
    monkeypatch.setattr(sweep_script, "ROOT", tmp_path)
    monkeypatch.setattr(sweep_script, "finished", lambda job: False)
    assert sweep_script.run_locally("fails", [["a"]], stop_after_min=5) == 1


def test_the_launchers_stop_signal_is_one_the_trainer_checkpoints_on():
    from training.runtime.preemption import STOP_SIGNALS

    assert signal.SIGTERM in STOP_SIGNALS


def test_a_time_slice_is_refused_for_a_cluster_launcher(capsys):
    with pytest.raises(SystemExit):
        sweep_script.main(["study_lr", "--stop-after", "3"])
    assert "--stop-after" in capsys.readouterr().err


@pytest.mark.slow  # composes 24 jobs five times
def test_only_runs_the_jobs_with_the_values_named_and_refuses_an_unknown_key(capsys):
    sweep_script.main(["optimizers_muon_seeds", "--launcher", "basic", "--dry-run"])
    every = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    args = ["optimizers_muon_seeds", "--launcher", "basic", "--dry-run", "--only", "model.dim=64"]
    assert sweep_script.main([*args, "--only", "optim.muon.lr=0.04"]) == 0
    chosen = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert chosen == [line for line in every if "model.dim=64 " in line]
    assert len(chosen) == 16  # at width 64: 4 activations x seeds 1-3, 2 of them 4-5 too
    with pytest.raises(SystemExit, match=r"no job has model\.dim=65"):
        sweep_script.main([*args[:-1], "model.dim=65"])
    with pytest.raises(SystemExit, match=r"'model\.width' is not a configuration key"):
        sweep_script.main([*args[:-1], "model.width=64"])
    with pytest.raises(SystemExit):
        sweep_script.main(["optimizers_muon_seeds", "--only", "model.dim=64"])
    assert "--only" in capsys.readouterr().err


def test_a_sweep_whose_jobs_share_a_run_directory_or_overflow_its_name_is_refused_before_any_runs(
    monkeypatch,
):
    launched = []
    monkeypatch.setattr(sweep_script, "run_locally", lambda *a, **k: launched.append(a))
    same = {  # two grids, one point each, nothing varied between them that names a directory
        "grids": [
            {"overrides": ["experiment=study", "trainer.run_dir=runs/shared"], "sweep": {}},
            {"overrides": ["experiment=study", "trainer.run_dir=runs/shared"], "sweep": {}},
        ]
    }
    long_name = "x" * 250  # + "-relu2" and the varied lr: over 255 bytes
    too_long = {
        "grids": [
            {"overrides": ["experiment=study", f"name={long_name}"], "sweep": {"optim.lr": [1e-3]}},
            {"overrides": ["experiment=study", f"name={long_name}"], "sweep": {"optim.lr": [2e-3]}},
        ]
    }
    for sweep, message in (
        (same, "two jobs would train in runs/shared"),
        (too_long, "over the 255"),
    ):
        monkeypatch.setattr(sweep_script, "load_sweep", lambda name, sweep=sweep: sweep)
        with pytest.raises(SystemExit, match=message):
            sweep_script.main(["synthetic", "--launcher", "basic"])
    assert not launched


def test_a_run_directory_name_may_take_255_bytes_and_not_one_more():
    from training.sweeps import check_run_dirs

    fits = "é" * 127 + "x"  # 255 bytes in UTF-8, 128 characters: bytes are what counts
    check_run_dirs([["experiment=study", f"trainer.run_dir='runs/{fits}'"]])
    with pytest.raises(SystemExit, match="named in 256 bytes, over the 255"):
        check_run_dirs([["experiment=study", f"trainer.run_dir='runs/{fits}y'"]])
    twice = ["experiment=study", "trainer.run_dir=runs/one"]
    with pytest.raises(SystemExit) as refused:
        check_run_dirs([twice, ["experiment=study", "trainer.seed=3", "trainer.run_dir=runs/one"]])
    assert str(refused.value).splitlines()[1:3] == [
        "  experiment=study trainer.run_dir=runs/one",
        "  experiment=study trainer.seed=3 trainer.run_dir=runs/one",
    ]
