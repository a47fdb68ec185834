"""Sweeps: the paper's tables expand to exactly their rows; submitit runs jobs; results tables."""

import math
import os
import subprocess
import sys

import pytest

from data_fixtures import write_parquet_corpus
from eval.paper import ABLATION_TABLE, MAIN_COMPARISON
from scripts.results_table import main as results_table
from train_helpers import ROOT, SWEEP_DATA, SWEEP_POINTS, compose, metrics, tiny_overrides
from training.config import config_value
from training.runtime.distributed import adopt_slurm_tasks
from training.sweeps import commands, expand, load_sweep, resolve

TAGS = "logging.wandb.tags=[activation:${model.activation},optim:${optim.name},dim:${model.dim},seed:${trainer.seed}]"  # noqa: E501


def grouped(sweep: str) -> list[str]:
    """What every job of ``sweep`` gets for wandb: its group, and its values as tags."""
    return [f"logging.wandb.group={sweep}", TAGS]


@pytest.mark.slow
def test_ablation_sweep_is_the_papers_ablation_table_row_by_row():
    jobs = expand(load_sweep("ablation"))
    assert jobs == [
        ["experiment=ablation_1b", f"activation={row.activation}", *grouped("ablation")]
        for row in ABLATION_TABLE
    ]
    for job in jobs:
        config, _ = compose([*job, "data.paths=[/data/*.parquet]"])
        assert config.name == "ablation_1b" and config.data.tokenizer.name == "llama3"
        assert f"activation={config.model.activation}" in job


def test_main_sweep_is_the_papers_main_comparison():
    jobs = expand(load_sweep("main"), ["data.paths=[/d/*.parquet]"])
    expected = [
        [f"experiment={e}", f"activation={a}", *grouped("main"), "data.paths=[/d/*.parquet]"]
        for e, acts in MAIN_COMPARISON.items()
        for a in acts
    ]
    assert jobs == expected
    first, second = commands(load_sweep("main"), "submitit_slurm")
    assert "activation=swiglu,relu2,xiprelu,xielu" in first and "hydra.launcher.nodes=22" in first
    assert "activation=swiglu,xielu" in second and "hydra.launcher.nodes=32" in second


def test_each_jobs_wandb_run_is_grouped_by_its_sweep_and_tagged_with_its_values():
    """The group is the sweep; the tags its activation, optimizer, width and seed, read from
    the job's own config; a group or tags the command line gives win, for every job."""
    sweep = load_sweep("optimizers_muon_seeds")
    config, _ = compose(expand(sweep)[0])
    assert config.logging.wandb.group == "optimizers_muon_seeds"
    tags = ["activation:relu2", "optim:muon", "dim:64", "seed:1"]
    assert config.logging.wandb.tags == tags
    mine = ["logging.wandb.group=mine", "logging.wandb.tags=[a,b]"]
    for job in [expand(sweep, mine)[-1], commands(sweep, "basic", mine)[-1]]:
        assert sum(o.startswith("logging.wandb.") for o in job) == 2
    config, _ = compose(expand(sweep, mine)[-1])
    assert config.logging.wandb.group == "mine" and config.logging.wandb.tags == ["a", "b"]


@pytest.mark.slow
def test_dry_run_prints_every_job_and_submits_nothing():
    out = subprocess.run(
        [sys.executable, "-m", "scripts.sweep", "ablation", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("13 jobs in 1 multirun call(s)")
    assert "activation=xielu_neg_zero" in out and "hydra/launcher=submitit_slurm" in out


@pytest.mark.parametrize("ladder", ["ladder_h100", "ladder_gh200"])
def test_a_tuned_ladder_lists_its_jobs_without_data_paths_or_names_the_missing_key(ladder, capsys):
    """Its --dry-run printed 40 lines of traceback ending in "data.paths must list
    files", while main --dry-run listed its jobs."""
    from scripts.sweep import main

    assert main([ladder, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "read from its finished runs when this sweep is launched" in out
    assert "jobs in " in out and "activation=xielu" in out
    with pytest.raises(SystemExit) as refused:
        main([ladder])  # launching needs the tuning sweep's runs, composed with data.paths
    message = str(refused.value)
    assert "data.paths must list files" in message and "\n" not in message


def test_slurm_tasks_become_torch_distributed_ranks(tmp_path, monkeypatch):
    (tmp_path / "scontrol").write_text('#!/bin/sh\nprintf "nid001\\nnid002\\n"\n')
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    env = {
        "SLURM_NTASKS": "8",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "nid[001-002]",
        "SLURM_JOB_ID": "123456",
    }
    adopt_slurm_tasks(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert env["MASTER_ADDR"] == "nid001" and env["MASTER_PORT"] == "23456"
    torchrun = {"RANK": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "3"}
    adopt_slurm_tasks(torchrun)  # torchrun's own variables win
    assert torchrun["RANK"] == "0" and "WORLD_SIZE" not in torchrun
    # the batch script (or an salloc shell) of an 8-task job: no srun step, one process
    batch = {"SLURM_NTASKS": "8", "SLURM_PROCID": "0", "SLURM_JOB_ID": "123456"}
    adopt_slurm_tasks(batch)
    assert "RANK" not in batch and "WORLD_SIZE" not in batch


@pytest.mark.slow
def test_submitit_local_runs_a_two_job_sweep_and_the_table_reads_it(tmp_path):
    corpus = tmp_path / "corpus"
    write_parquet_corpus(corpus, files=2)
    overrides = tiny_overrides(
        corpus, tmp_path / "runs" / "${model.activation}", **{"validation.every": 8}
    )
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        *overrides,
        "activation=xielu,relu2",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={tmp_path}/sweep",
        "hydra.launcher.timeout_min=10",
    ]
    result = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    runs = [tmp_path / "runs" / name for name in ("xielu", "relu2")]
    for run in runs:
        assert max(m["step"] for m in metrics(run)) == 12
    rows = results_table([str(r) for r in runs])
    assert [r["activation"] for r in rows] == ["xielu", "relu2"]
    for run, row in zip(runs, rows, strict=True):
        # 12 steps, 4 of cooldown: the stable phase ends at step 8, validated by eval_every=8
        validation = {m["step"]: m["val/loss"] for m in metrics(run) if "val/loss" in m}
        assert validation.keys() == {8, 12} and validation[8] != validation[12]
        assert (row["stable_loss"], row["final_loss"]) == (validation[8], validation[12])
        assert row["stable_ppl"] == pytest.approx(math.exp(validation[8]))
        assert row["final_ppl"] == pytest.approx(math.exp(validation[12]))


def test_null_booleans_and_lists_in_a_sweep_reach_the_config_as_values():
    """YAML null, true and lists become Hydra's null, true and [a,b], not the strings 'None',
    'True' and "['a', 'b']": the composed config holds the values the sweep file wrote."""
    sweep = {
        "grids": [
            {
                "overrides": ["experiment=quickstart"],
                "sweep": {
                    "model.mlp_hidden": [None],
                    "checkpoint.async_write": [True],
                    "profile.steps": [[2, 3]],
                },
            }
        ]
    }
    (job,) = expand(sweep)
    config, _ = compose(job)
    assert config.model.mlp_hidden is None
    assert config.checkpoint.async_write is True
    assert config.profile.steps == [2, 3]
    (cmd,) = commands(sweep, "basic")
    assert "model.mlp_hidden=null" in cmd and "checkpoint.async_write=true" in cmd


@pytest.mark.slow
def test_every_point_of_the_study_grid_gets_its_own_run_directory_and_axes():
    jobs = expand(load_sweep("study_lr"))
    assert len(jobs) == 32  # 2 initialisations x 4 activations x 4 learning rates
    configs = [compose(job)[0] for job in jobs]
    run_dirs = {c.trainer.run_dir for c in configs}
    assert len(run_dirs) == 32
    assert "runs/study-xielu_init_scaling-width_lr-0.006" in run_dirs
    for config in configs:
        assert {"model.activation", "model.init_scaling", "optim.lr"} <= set(config.trainer.axes)
        assert config.data.seed == config.trainer.seed  # a seed is the init and the data order


@pytest.mark.slow
def test_muons_rate_and_the_optimizer_name_every_jobs_directory_and_are_its_axes():
    """The Muon seeds sweep varies only optim.lr and the seed, yet a rerun at another Muon rate
    must not find these runs finished, nor resume one of them at its new rate."""
    sweep = load_sweep("optimizers_muon_seeds")
    (job,) = [j for j in expand(sweep) if "activation=relu2" in j and "trainer.seed=1" in j][:1]
    config = compose(job)[0]
    assert config.trainer.run_dir.endswith("_optim-muon_muon_lr-0.04")
    assert {"optim.name", "optim.muon.lr"} <= set(config.trainer.axes)
    other = [o if not o.startswith("optim.muon.lr=") else "optim.muon.lr=0.08" for o in job]
    assert compose(other)[0].trainer.run_dir.endswith("_optim-muon_muon_lr-0.08")
    adamw = compose(expand(load_sweep("optimizers_seeds"))[0])[0]
    assert (
        adamw.trainer.run_dir.endswith("_optim-adamw") and "optim.muon.lr" not in adamw.trainer.axes
    )


def test_a_resume_may_not_change_the_rate_the_optimizer_was_tuned_at():
    """optim.muon.lr under Muon is refused as optim.lr is, with or without the sweep's axes;
    an AdamW run does not read it, and may."""
    from train_helpers import with_setting
    from training.config import ExperimentConfig
    from training.resume_rules import fixed_changes

    saved = with_setting(ExperimentConfig(), "optim.name", "muon")
    assert fixed_changes(saved, with_setting(saved, "optim.muon.lr", 0.08)) == [
        ("optim.muon.lr", 0.02, 0.08)
    ]
    assert fixed_changes(saved, with_setting(saved, "optim.lr", 0.01)) == [
        ("optim.lr", 0.003, 0.01)
    ]
    adamw = ExperimentConfig()
    assert fixed_changes(adamw, with_setting(adamw, "optim.muon.lr", 0.08)) == []


def test_grids_that_differ_in_a_list_or_in_keys_of_one_last_name_get_loadable_distinct_dirs():
    """Two grids that differ in a list-valued setting (``optim.betas``) and in two keys whose
    last part is the same (``name``, ``optim.name``): every job's directory is a path Hydra
    reads back (no ``[`` or ``,`` in it) and names both keys apart (the optimizer is always
    named, as ``optim``)."""
    fixed = ["experiment=quickstart", "data.paths=[/x/*.parquet]"]
    sweep = {
        "grids": [
            {"overrides": [*fixed, "name=one"], "sweep": {"optim.lr": [0.001]}},
            {
                "overrides": [*fixed, "name=two", "optim.name=ademamix", "optim.betas=[0.9,0.999]"],
                "sweep": {"optim.lr": [0.001]},
            },
        ]
    }
    run_dirs = [compose(job)[0].trainer.run_dir for job in expand(sweep)]
    assert run_dirs == [
        "runs/one-xielu_name-one_betas-default_optim-adamw",
        "runs/two-xielu_name-two_betas-0.9-0.999_optim-ademamix",
    ]


@pytest.mark.slow
def test_a_hydra_multirun_over_learning_rates_trains_each_rate_in_its_own_directory(tmp_path):
    """Before, every job of a grid over lr shared ``runs/<name>-<activation>``: the second one
    resumed the first one's final checkpoint and trained zero steps."""
    corpus = tmp_path / "corpus"
    write_parquet_corpus(corpus, files=2)
    base = tiny_overrides(corpus, tmp_path / "runs" / "lr", **{"trainer.steps": 4})
    sweep = {
        "grids": [
            {"overrides": [*base, "schedule.decay_steps=1"], "sweep": {"optim.lr": [0.001, 0.004]}}
        ]
    }
    (cmd,) = commands(sweep, "basic")
    cmd += [f"hydra.sweep.dir={tmp_path}/sweep"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for lr in ("0.001", "0.004"):
        run = tmp_path / "runs" / f"lr_lr-{lr}"
        assert max(m["step"] for m in metrics(run)) == 4
        assert [m["lr"] for m in metrics(run) if m.get("step") == 2] == [float(lr)]


@pytest.mark.slow
@pytest.mark.xdist_group(SWEEP_POINTS)
def test_the_gpu_ladders_train_about_20_tokens_per_parameter_each_in_its_own_directory():
    from model import count_parameters, training_flops_per_token
    from scripts.estimate_sweep import job_cost

    for name, widths in (("ladder_h100", 3), ("ladder_gh200", 3), ("optimizers_gh200", 1)):
        jobs = expand(load_sweep(name), SWEEP_DATA)
        configs = [resolve(job) for job in jobs]
        assert len({c.trainer.run_dir for c in configs}) == len(jobs)
        assert len({c.model.dim for c in configs}) == widths
        cost = job_cost(jobs[0])
        model = configs[0].model.with_vocab_from_tokenizer(131072)  # Tekken
        tokens = configs[0].trainer.steps * configs[0].trainer.global_batch * 2048
        assert cost["tokens"] == tokens and cost["params"] == count_parameters(model).total
        assert cost["flops"] == training_flops_per_token(model, 2048) * tokens
        for config in configs:
            m = config.model.with_vocab_from_tokenizer(131072)
            per_param = config.trainer.steps * config.trainer.global_batch * 2048
            assert 17 < per_param / count_parameters(m).total < 23, config.model.dim


@pytest.mark.slow  # composes about 250 jobs
@pytest.mark.xdist_group(SWEEP_POINTS)
@pytest.mark.parametrize(
    "ladder", ["ladder_h100", "ladder_gh200", "ladder_short", "width_ladder", "optimizers_gh200"]
)
def test_every_ladder_is_mup_tuned_at_its_base_width_with_the_same_depth_batch_and_head_dim(
    ladder,
):
    """µP carries rates across width only: the tuning sweep must train every activation of the
    ladder at the ladder's base width, depth, batch and head_dim, on a seed the ladder does not
    report. The rungs differ from each other in width (and in steps, on GPUs) alone."""
    sweep = load_sweep(ladder)
    rungs = [resolve(job) for job in expand(sweep, SWEEP_DATA)]
    tuning = [resolve(job) for job in expand(load_sweep(sweep["tuned_by"]), SWEEP_DATA)]
    (base,) = {c.model.mup_base_dim for c in rungs}
    assert {c.model.parametrization for c in rungs} == {"mup"}
    at_base = [c for c in tuning if c.model.parametrization == "mup" and c.model.dim == base]
    arms = {(c.model.activation, c.optim.name) for c in rungs}
    assert {(c.model.activation, c.optim.name) for c in at_base} == arms
    for activation, optimizer in arms:  # a grid of its optimizer's rate, not one guess
        tried = {
            config_value(c, c.optim.tuned_rate)
            for c in at_base
            if (c.model.activation, c.optim.name) == (activation, optimizer)
        }
        assert len(tried) >= 4, (activation, optimizer)

    def untuned(c, carried):  # the optimizer's settings but the rates the ladder takes
        return tuple(sorted((k, str(v)) for k, v in vars(c.optim).items() if k not in carried))

    for arm in arms:  # the same optimizer in both stages, the tuned rates apart
        tuned = [c for c in at_base if (c.model.activation, c.optim.name) == arm]
        carried = {tuned[0].optim.tuned_rate.split(".")[1]}
        if len({c.optim.lr for c in tuned}) > 1:  # Muon's AdamW part tuned with it: a pair
            carried.add("lr")
        same = [c for c in rungs if (c.model.activation, c.optim.name) == arm] + tuned
        assert len({untuned(c, carried) for c in same}) == 1, arm
    for key in (
        lambda c: c.model.n_layers,
        lambda c: c.model.head_dim,
        lambda c: c.trainer.global_batch,
        lambda c: c.data.seq_len,
        lambda c: c.model.init_std,
        lambda c: c.model.gated_hidden / c.model.dim,
    ):
        assert len({key(c) for c in [*rungs, *at_base]}) == 1
    assert {c.trainer.seed for c in at_base} == {0}
    assert 0 not in {c.trainer.seed for c in rungs}


def test_the_sweeps_price_is_the_mfu_measured_in_the_performance_table():
    """``scripts.estimate_sweep``'s default MFU is ReLU²'s row of docs/performance.md's paper_1b
    training table, not an older figure."""
    import re
    from pathlib import Path

    from scripts.estimate_sweep import MEASURED_MFU

    page = (Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text()
    h100 = page.split("## Measured on one H100")[1]
    table = h100.split("**Training, paper_1b")[1]
    row = next(line for line in table.splitlines() if line.startswith("| ReLU² |"))
    mfu = re.findall(r"([\d.]+)%", row)[0]
    assert pytest.approx(float(mfu) / 100) == MEASURED_MFU
