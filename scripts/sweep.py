"""Launch one of the paper's sweeps (``configs/sweep/*.yaml``) through Hydra multirun.

    python -m scripts.sweep ablation --dry-run            # the jobs it would submit
    python -m scripts.sweep ablation                      # submitit SLURM launcher, one job/row
    python -m scripts.sweep main data.paths='[/scratch/fw/*.parquet]'
    python -m scripts.sweep mini_ablation --launcher basic   # in this process, one after another

Each grid of the sweep file becomes one ``python train.py -m ...`` call; its ``sweep`` lists
become Hydra's comma-separated sweep values, extra arguments are appended to every job. Under
``submitit_slurm`` each job gets ``nodes x tasks_per_node`` processes; the trainer reads its rank
from SLURM's variables (``training/distributed.py``).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "configs" / "sweep"


def load_sweep(name: str) -> dict:
    path = SWEEPS / f"{name}.yaml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in SWEEPS.glob("*.yaml")))
        raise SystemExit(f"sweep {name!r} not found; choose one of: {have}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def expand(sweep: dict, extra: list[str] = ()) -> list[list[str]]:
    """Every job of the sweep as its list of overrides, in file order."""
    jobs = []
    for grid in sweep["grids"]:
        keys = list(grid["sweep"])
        for values in itertools.product(*(grid["sweep"][k] for k in keys)):
            jobs.append(
                [
                    *grid["overrides"],
                    *(f"{k}={v}" for k, v in zip(keys, values, strict=True)),
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
        cmd += [f"{k}={','.join(map(str, v))}" for k, v in grid["sweep"].items()]
        cmd.append(f"hydra/launcher={launcher}")
        if launcher.startswith("submitit"):
            cmd += [
                f"hydra.launcher.{k}={v}"
                for k, v in settings.items()
                if launcher == "submitit_slurm" or k in ("timeout_min", "tasks_per_node")
            ]
        out.append([*cmd, *extra])
    return out


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
    args = parser.parse_args(argv)
    sweep = load_sweep(args.sweep)
    jobs = expand(sweep, args.overrides)
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
