"""Launch one of the paper's sweeps (``configs/sweep/*.yaml``) through Hydra multirun.

    python -m scripts.sweep ablation --dry-run            # the jobs it would submit
    python -m scripts.sweep ablation                      # submitit SLURM launcher, one job/row
    python -m scripts.sweep main data.paths='[/scratch/fw/*.parquet]'
    python -m scripts.sweep mini_ablation --launcher basic   # in this process, one after another

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
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

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


def expand(sweep: dict, extra: list[str] = ()) -> list[list[str]]:
    """Every job of the sweep as its list of overrides, in file order."""
    jobs = []
    for grid in sweep["grids"]:
        keys = list(grid["sweep"])
        for values in itertools.product(*(grid["sweep"][k] for k in keys)):
            jobs.append(
                [
                    *grid["overrides"],
                    *(f"{k}={override_value(v)}" for k, v in zip(keys, values, strict=True)),
                    *extra,
                ]
            )
    return jobs


def commands(sweep: dict, launcher: str, extra: list[str] = ()) -> list[list[str]]:
    """One ``train.py -m`` command per grid."""
    out = []
    for grid in sweep["grids"]:
        settings = {**sweep.get("launcher", {}), **grid.get("launcher", {})}
        cmd = [sys.executable, "train.py", "-m", *grid["overrides"]]
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


def run_one_by_one(name: str, jobs: list[list[str]]) -> int:
    """Each job as its own ``train.py`` process, in order, under a bar over the runs; the first
    failure stops the sweep (its exit code is returned)."""
    started = time.perf_counter()
    bar = tqdm(total=len(jobs), desc=f"sweep {name}", unit="run", file=sys.stderr)
    failed = None
    for job in jobs:
        bar.clear()  # the run's own output starts on a clean line
        if subprocess.run([sys.executable, "train.py", *job], cwd=ROOT).returncode:
            failed = job
            break
        bar.update(1)
    bar.close()
    minutes = (time.perf_counter() - started) / 60
    done = f"{bar.n}/{len(jobs)} runs finished in {minutes:.1f} min"
    if failed is not None:
        print(f"sweep {name}: {done}; stopped at the failed run: {' '.join(failed)}")
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
    args = parser.parse_intermixed_args(argv)  # overrides may follow --launcher
    sweep = load_sweep(args.sweep)
    jobs = expand(sweep, args.overrides)
    if args.launcher == "basic":
        if args.dry_run:
            print(f"{len(jobs)} jobs, run one after another:")
            for job in jobs:
                print("$ train.py " + " ".join(job))
            return 0
        return run_one_by_one(args.sweep, jobs)
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
