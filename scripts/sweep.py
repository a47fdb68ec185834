"""Launch one of the paper's sweeps (``configs/sweep/*.yaml``) through Hydra multirun.

    python -m scripts.sweep ablation --dry-run            # the jobs it would submit
    python -m scripts.sweep ablation                      # submitit SLURM launcher, one job/row
    python -m scripts.sweep main data.paths='[/scratch/fw/*.parquet]'
    python -m scripts.sweep mini_ablation --launcher basic   # here, one after another
    python -m scripts.sweep study_lr --launcher basic --parallel 2   # here, two at a time

Each grid of the sweep file becomes one ``python train.py -m ...`` call; its ``sweep`` lists
become Hydra's comma-separated sweep values, extra arguments are appended to every job. Under
``submitit_slurm`` each job gets ``nodes x tasks_per_node`` processes; the trainer reads its rank
from SLURM's variables (``training/distributed.py``). The ``basic`` launcher instead runs every
job as its own ``python train.py ...`` process, one after another under a progress bar over the
runs (the run directories are the same: ``trainer.run_dir`` does not depend on Hydra's multirun).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from training.config import DEFAULT_AXES

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "configs" / "sweep"


def load_sweep(name: str) -> dict:
    path = SWEEPS / f"{name}.yaml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in SWEEPS.glob("*.yaml")))
        raise SystemExit(f"sweep {name!r} not found; choose one of: {have}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


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
    parts = []
    for key in varying_keys(sweep):
        name = key.lstrip("+~")
        if name in IN_BASE_RUN_DIR:
            continue
        if key in grid["sweep"]:
            value = "${" + name + "}" if "." in name else "${hydra:runtime.choices." + name + "}"
        else:
            value = fixed.get(key, "default")
        parts.append(f"_{name.rsplit('.', 1)[-1]}-{value}")
    axes = list(DEFAULT_AXES)
    for key in varying_keys(sweep):
        name = GROUP_KEYS.get(key.lstrip("+~"), key.lstrip("+~"))
        if "." in name and name not in axes:
            axes.append(name)
    if not parts:  # the run directory already tells the jobs apart
        return [f"trainer.run_dir={base}"] if "trainer.run_dir" in fixed else []
    return [
        f"trainer.run_dir={base}" + "".join(parts),
        f"trainer.axes=[{','.join(axes)}]",
    ]


def expand(sweep: dict, extra: list[str] = ()) -> list[list[str]]:
    """Every job of the sweep as its list of overrides, in file order."""
    jobs = []
    for grid in sweep["grids"]:
        for job in _grid_jobs(grid):
            jobs.append([*job, *point_overrides(sweep, grid), *extra])
    return jobs


def commands(sweep: dict, launcher: str, extra: list[str] = ()) -> list[list[str]]:
    """One ``train.py -m`` command per grid."""
    out = []
    for grid in sweep["grids"]:
        settings = {**sweep.get("launcher", {}), **grid.get("launcher", {})}
        cmd = [sys.executable, "train.py", "-m", *_without_run_dir(grid["overrides"])]
        cmd += point_overrides(sweep, grid)
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


def run_locally(name: str, jobs: list[list[str]], parallel: int = 1) -> int:
    """Each job as its own ``train.py`` process, ``parallel`` at a time (each with
    ``cores // parallel`` threads), in order, under a bar over the runs; a failure stops
    launching new jobs (the running ones finish) and the sweep returns 1. Each job's output
    goes to ``<run_dir>.log`` when ``parallel > 1`` (interleaved lines would be unreadable)."""
    started = time.perf_counter()
    threads = max(1, (os.cpu_count() or 1) // parallel)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    bar = tqdm(total=len(jobs), desc=f"sweep {name}", unit="run", file=sys.stderr)
    pending, running, failed = list(jobs), [], []
    while pending or running:
        while pending and len(running) < parallel and not failed:
            job = pending.pop(0)
            bar.clear()  # the run's own output starts on a clean line
            out = None
            if parallel > 1:
                log_path = ROOT / "runs" / "sweep-logs" / f"{name}-{len(jobs) - len(pending)}.log"
                log_path.parent.mkdir(parents=True, exist_ok=True)
                out = log_path.open("w")
            cmd = [sys.executable, "train.py", *job]
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out)
            running.append((proc, job, out))
        if not running:
            break
        time.sleep(0.2)
        for entry in list(running):
            proc, job, out = entry
            if proc.poll() is None:
                continue
            running.remove(entry)
            if out is not None:
                out.close()
            if proc.returncode:
                failed.append(job)
            else:
                bar.update(1)
    bar.close()
    minutes = (time.perf_counter() - started) / 60
    done = f"{bar.n}/{len(jobs)} runs finished in {minutes:.1f} min"
    if failed:
        print(f"sweep {name}: {done}; failed: " + "; ".join(" ".join(j) for j in failed))
        return 1
    print(f"sweep {name}: {done}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep", help="a file in configs/sweep/ (ablation, main, mini_ablation)")
    parser.add_argument("overrides", nargs="*", help="appended to every job")
    parser.add_argument(
        "--launcher",
        default="submitit_slurm",
        choices=["submitit_slurm", "submitit_local", "basic"],
    )
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="basic launcher: jobs at once, sharing the cores (logs in runs/sweep-logs/)",
    )
    args = parser.parse_intermixed_args(argv)  # overrides may follow --launcher
    sweep = load_sweep(args.sweep)
    jobs = expand(sweep, args.overrides)
    if args.launcher == "basic":
        if args.dry_run:
            print(f"{len(jobs)} jobs, run one after another:")
            for job in jobs:
                print("$ train.py " + " ".join(job))
            return 0
        return run_locally(args.sweep, jobs, args.parallel)
    cmds = commands(sweep, args.launcher, args.overrides)
    if args.dry_run:
        print(f"{len(jobs)} jobs in {len(cmds)} multirun call(s):")
        for i, job in enumerate(jobs):
            print(f"  [{i:2d}] {' '.join(job)}")
        for cmd in cmds:
            print("$ " + " ".join(cmd[1:]))
        return 0
    for cmd in cmds:
        result = subprocess.run(cmd, cwd=ROOT)
        if result.returncode:
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
