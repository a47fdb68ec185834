"""The sweep files of ``configs/sweep/`` as jobs: each grid point's overrides, run directory and
axes, and the ``train.py -m`` call that submits a grid through Hydra's launchers.

``scripts/sweep.py`` launches them; ``scripts/estimate_sweep.py`` prices them; tests compose
them. A sweep file lists ``grids``, each with fixed ``overrides``, ``sweep`` lists whose
product gives the grid's jobs, and optional ``launcher`` settings.
"""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

from omegaconf import OmegaConf

from training.config import DEFAULT_AXES
from training.optim import OPTIMIZERS
from training.renamed_keys import refuse_renamed

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "configs" / "sweep"


def load_sweep(name: str) -> dict:
    path = SWEEPS / f"{name}.yaml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in SWEEPS.glob("*.yaml")))
        raise SystemExit(f"sweep {name!r} not found; choose one of: {have}")
    sweep = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return {**sweep, "name": name}  # the jobs' wandb group


def override_value(value) -> str:
    """A YAML value as Hydra's override grammar spells it: ``null``, ``true``/``false``, lists
    as ``[a,b]`` (``str`` would give ``None``, ``True`` and ``['a', 'b']``, which Hydra reads
    as strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    return str(value)


# Hydra groups whose choice is also a config value; the base run directory holds both
GROUP_KEYS = {"activation": "model.activation"}
RUN_DIR = "runs/${name}-${model.activation}"  # TrainerConfig.run_dir's default
IN_BASE_RUN_DIR = ("activation", "experiment")  # what RUN_DIR already names
# what names a job's run directory and is one of its axes, varied or not, with its label: the
# optimizer, where the sweep chooses it, and the rate an optimizer trains the hidden matrices at
# (Muon's), which a rate sweep of it varies: a rerun at another rate never lands in a finished
# run's directory (the optimizer is one of every run's axes: training.config.DEFAULT_AXES)
OPTIMIZER_KEYS = {
    "optim.name": "optim",
    **{
        f"optim.{name}.{o.matrix_rate}": f"{name}_{o.matrix_rate}"
        for name, o in OPTIMIZERS.items()
        if o.matrix_rate
    },
}


# each job's wandb run: grouped by its sweep, tagged with the values researchers filter on
WANDB_GROUP = "logging.wandb.group"
WANDB_TAGS = "logging.wandb.tags"
TAGGED = {
    "activation": "model.activation",
    "optim": "optim.name",
    "dim": "model.dim",
    "seed": "trainer.seed",
}


def wandb_overrides(sweep: dict, grid: dict, extra: list[str] = ()) -> list[str]:
    """``logging.wandb.group``: the sweep's name; ``logging.wandb.tags``: the job's activation,
    optimizer, width and seed (``activation:xielu``), interpolated, so that one ``train.py -m``
    call tags each of its jobs; either left out where the grid or the command line sets it."""
    given = {_key(o) for o in [*grid["overrides"], *grid["sweep"], *extra]}
    out = []
    if WANDB_GROUP not in given and "name" in sweep:
        out.append(f"{WANDB_GROUP}={sweep['name']}")
    if WANDB_TAGS not in given:
        tags = ",".join(f"{label}:${{{key}}}" for label, key in TAGGED.items())
        out.append(f"{WANDB_TAGS}=[{tags}]")
    return out


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _grid_jobs(grid: dict) -> list[list[str]]:
    keys = list(grid["sweep"])
    return [
        [
            *grid["overrides"],
            *(f"{k}={override_value(v)}" for k, v in zip(keys, values, strict=True)),
        ]
        for values in itertools.product(*(grid["sweep"][k] for k in keys))
    ]


def _without_run_dir(overrides: list[str]) -> list[str]:
    """A grid's ``trainer.run_dir`` is the base of its points' directories (point_overrides)."""
    return [o for o in overrides if _key(o) != "trainer.run_dir"]


def varying_keys(sweep: dict) -> list[str]:
    """The keys whose value is not the same in every job of the sweep (in first-seen order):
    the ones that must name a job's run directory and its ``trainer.axes``."""
    jobs = [dict(o.split("=", 1) for o in job) for g in sweep["grids"] for job in _grid_jobs(g)]
    order = list(dict.fromkeys(k for job in jobs for k in job))
    return [k for k in order if len({job.get(k) for job in jobs}) > 1]


def point_overrides(sweep: dict, grid: dict) -> list[str]:
    """``trainer.run_dir`` and ``trainer.axes`` for each job of ``grid``: one directory per grid
    point, named by every key the sweep varies (``runs/study-xielu_lr-0.003_seed-1``; the
    grid's own ``trainer.run_dir``, if it sets one, instead of ``runs/${name}-...``). The
    name interpolates the keys the grid sweeps, so that one ``train.py -m`` call (submitit)
    gives each of its jobs its own directory."""
    fixed = dict(o.split("=", 1) for o in grid["overrides"])
    base = fixed.get("trainer.run_dir", RUN_DIR)
    varying = [k for k in varying_keys(sweep) if k.lstrip("+~") not in OPTIMIZER_KEYS]
    last_parts = [key.lstrip("+~").rsplit(".", 1)[-1] for key in varying]
    parts = []
    for key, last in zip(varying, last_parts, strict=True):
        name = key.lstrip("+~")
        if name in IN_BASE_RUN_DIR:
            continue
        # a key is named by its last part, unless another varying key ends the same way
        label = name.replace(".", "_") if last_parts.count(last) > 1 else last
        if key in grid["sweep"]:
            value = "${" + name + "}" if "." in name else "${hydra:runtime.choices." + name + "}"
        else:  # a list is written out as a path Hydra's grammar reads back: [a,b] -> a-b
            value = fixed.get(key, "default").strip("[]").replace(",", "-").replace(" ", "")
        parts.append(f"_{label}-{value}")
    # the optimizer wherever the sweep chooses one; a rate only where this grid trains with it
    named = [
        k for k in OPTIMIZER_KEYS if (_names(sweep, k) if k == "optim.name" else _trains(grid, k))
    ]
    parts += [f"_{OPTIMIZER_KEYS[k]}-${{{k}}}" for k in named]
    axes = list(DEFAULT_AXES)
    for key in [*varying, *named]:
        name = GROUP_KEYS.get(key.lstrip("+~"), key.lstrip("+~"))
        if "." in name and name not in axes:
            axes.append(name)
    if not parts:  # the run directory already tells the jobs apart
        return [f"trainer.run_dir={base}"] if "trainer.run_dir" in fixed else []
    return [
        f"trainer.run_dir={base}" + "".join(parts),
        f"trainer.axes=[{','.join(axes)}]",
    ]


def _names(sweep: dict, key: str) -> bool:
    """Whether any grid of the sweep sets ``key`` (``optim.name``), fixed or swept."""
    return any(
        key in grid["sweep"] or any(_key(o) == key for o in grid["overrides"])
        for grid in sweep["grids"]
    )


def _trains(grid: dict, rate_key: str) -> bool:
    """Whether a job of ``grid`` trains with the optimizer whose rate ``rate_key`` is
    (``optim.muon.lr``: ``optim.name=muon``, fixed or swept), or sets that rate."""
    optimizer = rate_key.split(".")[1]
    fixed = dict(o.split("=", 1) for o in grid["overrides"])
    names = [fixed.get("optim.name"), *grid["sweep"].get("optim.name", [])]
    return optimizer in names or rate_key in fixed or rate_key in grid["sweep"]


def resolve(job: list[str]):
    """The ExperimentConfig ``train.py`` would run for one job (its run directory resolved);
    Hydra's own settings (``hydra.*``) are the launcher's, not the run's, and are left out.
    Composing takes a tenth of a second and a ladder resolves its jobs and its tuning sweep's
    more than once, so each job's config is composed once per process: treat it as read-only."""
    return _resolved(tuple(o for o in job if not o.startswith("hydra")))


@functools.cache
def _resolved(job: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    from training.config import register_configs, to_experiment

    register_configs()
    refuse_renamed(list(job))
    with initialize_config_dir(str(SWEEPS.parent), version_base=None):
        return to_experiment(compose("train", list(job)))


UNREAD_PATHS = "data.paths=[/not/read]"


def with_unread_paths(overrides: list[str]) -> list[str]:
    """``overrides`` composable without data: local sources need ``data.paths``, and a job
    whose config is only inspected (its run directory, its price) reads none; paths it names
    stay."""
    if any(o.startswith("data.paths=") for o in overrides):
        return list(overrides)
    return [*overrides, UNREAD_PATHS]


def expand(sweep: dict, extra: list[str] = ()) -> list[list[str]]:
    """Every job of the sweep as its list of overrides, in file order; a key that moved
    (``training.renamed_keys``) is refused, naming its new place."""
    jobs = []
    for grid in sweep["grids"]:
        for job in _grid_jobs(grid):
            named = point_overrides(sweep, grid)
            jobs.append([*job, *named, *wandb_overrides(sweep, grid, extra), *extra])
            refuse_renamed(jobs[-1])
    return jobs


NAME_MAX = 255  # bytes in one path component on Linux file systems (ext4, xfs, Lustre)


def check_run_dirs(jobs: list[list[str]]) -> None:
    """Refuse, before any job runs, jobs that would share a run directory (the later would
    take the earlier's checkpoints for its own, or be skipped as finished) or a directory name
    longer than a file system takes (its job would fail at its first write, after the jobs
    before it ran)."""
    seen: dict[str, list[str]] = {}
    for job in jobs:
        run_dir = resolve(job).trainer.run_dir
        size = len(Path(run_dir).name.encode())
        if size > NAME_MAX:
            raise SystemExit(
                f"the run directory {run_dir} is named in {size} bytes, over the {NAME_MAX} a "
                "file system takes: shorten the sweep's name or the keys its grids vary"
            )
        if run_dir in seen:
            raise SystemExit(
                f"two jobs would train in {run_dir}:\n  {' '.join(seen[run_dir])}\n  "
                f"{' '.join(job)}\nvary a key that names the run directory"
            )
        seen[run_dir] = job


def commands(sweep: dict, launcher: str, extra: list[str] = ()) -> list[list[str]]:
    """One ``train.py -m`` command per grid."""
    out = []
    for grid in sweep["grids"]:
        settings = {**sweep.get("launcher", {}), **grid.get("launcher", {})}
        cmd = [sys.executable, "train.py", "-m", *_without_run_dir(grid["overrides"])]
        cmd += [*point_overrides(sweep, grid), *wandb_overrides(sweep, grid, extra)]
        cmd += [f"{k}={','.join(map(override_value, v))}" for k, v in grid["sweep"].items()]
        cmd.append(f"hydra/launcher={launcher}")
        if launcher.startswith("submitit"):
            cmd += [
                f"hydra.launcher.{k}={override_value(v)}"
                for k, v in settings.items()
                if launcher == "submitit_slurm" or k in ("timeout_min", "tasks_per_node")
            ]
        out.append([*cmd, *extra])
    return out
