"""Launch one of the paper's sweeps (``configs/sweep/*.yaml``) through Hydra multirun.

    python -m scripts.sweep ablation --dry-run            # the jobs it would submit
    python -m scripts.sweep ablation                      # submitit SLURM launcher, one job/row
    python -m scripts.sweep main data.paths='[/scratch/fw/*.parquet]'
    python -m scripts.sweep mini_ablation --launcher basic   # here, one after another
    python -m scripts.sweep study_lr --launcher basic --parallel 2   # here, two at a time

Each grid of the sweep file becomes one ``python train.py -m ...`` call; its ``sweep`` lists
become Hydra's comma-separated sweep values, extra arguments are appended to every job. Under
``submitit_slurm`` each job gets ``nodes x tasks_per_node`` processes; the trainer reads its rank
from SLURM's variables (``training/runtime/distributed.py``). The ``basic`` launcher instead runs
every job as its own ``python train.py ...`` process, one after another under a progress bar over
the runs. Either way each grid point trains in a directory of its own, named by the keys the sweep
varies (``training/sweeps.py``), so the two launchers' runs land in the same places.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from tqdm import tqdm

from training.sweeps import ROOT, commands, expand, load_sweep


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
