"""Launch one of the paper's sweeps (``configs/sweep/*.yaml``) through Hydra multirun.

    python -m scripts.sweep ablation --dry-run            # the jobs it would submit
    python -m scripts.sweep ablation                      # submitit SLURM launcher, one job/row
    python -m scripts.sweep main data.paths='[/scratch/fw/*.parquet]'
    python -m scripts.sweep mini_ablation --launcher basic   # here, one after another
    python -m scripts.sweep study_lr --launcher basic --parallel 2   # here, two at a time
    python -m scripts.sweep width_ladder --launcher basic --stop-after 9   # in slices: rerun it

Each grid of the sweep file becomes one ``python train.py -m ...`` call; its ``sweep`` lists
become Hydra's comma-separated sweep values, extra arguments are appended to every job. Under
``submitit_slurm`` each job gets ``nodes x tasks_per_node`` processes; the trainer reads its rank
from SLURM's variables (``training/runtime/distributed.py``). The ``basic`` launcher instead runs
every job as its own ``python train.py ...`` process, one after another under a progress bar over
the runs. Either way each grid point trains in a directory of its own, named by the keys the sweep
varies (``training/sweeps.py``), so the two launchers' runs land in the same places.

A sweep file with ``tuned_by: OTHER`` (a µP width ladder) takes its rate per activation and
optimizer (``optim.lr``, ``optim.muon.lr`` under Muon) from the finished runs of the sweep OTHER
at the base width (``eval/tuning.py``), and stops before launching anything while those are
missing. The basic launcher skips a job whose run already holds its final checkpoint, and
``--stop-after MINUTES`` ends the sweep in a time slice: the running jobs checkpoint and stop
(SIGTERM, the trainer's preemption path), and the same command run again resumes them where they
stopped. ``--only model.dim=64`` runs only the jobs whose config has that value, leaving the rest
for a later call (a study's smallest width first):

    python -m scripts.sweep optimizers_muon_seeds --launcher basic --only model.dim=64
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from eval.tuning import tuned_rates, with_tuned_rates
from training.checkpoint.layout import checkpoint_root, step_dir_name
from training.config import config_value
from training.errors import ConfigError
from training.runtime.preemption import EXIT_PREEMPTED
from training.sweeps import (
    ROOT,
    SWEEPS,
    check_run_dirs,
    commands,
    expand,
    load_sweep,
    override_value,
    resolve,
    with_unread_paths,
)


def finished(job: list[str]) -> bool:
    """Whether the job's run directory holds the checkpoint of its last step."""
    config = resolve(job)
    final = checkpoint_root(ROOT / config.trainer.run_dir) / step_dir_name(config.trainer.steps)
    return final.is_dir()


def has_values(job: list[str], only: list[str]) -> bool:
    """Whether the job's config has every ``KEY=VALUE`` of ``only`` (values as an override
    spells them); an unknown key is refused by name."""
    config = resolve(job)
    for item in only:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--only {item!r}: expected KEY=VALUE, e.g. model.dim=64")
        try:
            if override_value(config_value(config, key)) != value:
                return False
        except ConfigError as error:
            raise SystemExit(f"--only {item!r}: {error}") from None
    return True


def run_locally(
    name: str, jobs: list[list[str]], parallel: int = 1, stop_after_min: float | None = None
) -> int:
    """Each job as its own ``train.py`` process, ``parallel`` at a time (each with
    ``cores // parallel`` threads), in order, under a bar over the runs; a failure stops
    launching new jobs (the running ones finish) and the sweep returns 1. When ``parallel > 1``
    each job's output goes to ``runs/sweep-logs/<its run directory's name>.log`` (interleaved
    lines would be unreadable), appended to, so a resumed run's log keeps its earlier part.
    Jobs already finished are skipped; after ``stop_after_min`` minutes the running jobs are
    sent SIGTERM (they checkpoint and exit 75), nothing new starts, and the sweep itself
    returns 75: the same command run again goes on where this one stopped."""
    started = time.perf_counter()
    threads = max(1, (os.cpu_count() or 1) // parallel)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    bar = tqdm(total=len(jobs), desc=f"sweep {name}", unit="run", file=sys.stderr)
    pending = [job for job in jobs if not finished(job)]
    bar.update(len(jobs) - len(pending))
    running, failed, stopped = [], [], []
    while pending or running:
        if stop_after_min is not None and time.perf_counter() - started > 60 * stop_after_min:
            for proc, job, _ in running:
                proc.send_signal(signal.SIGTERM)
                stopped.append(job)
            pending.clear()
            stop_after_min = None  # signalled once; now wait for their checkpoints
        while pending and len(running) < parallel and not failed:
            job = pending.pop(0)
            bar.clear()  # the run's own output starts on a clean line
            out = None
            if parallel > 1:
                run_name = Path(resolve(job).trainer.run_dir).name
                log_path = ROOT / "runs" / "sweep-logs" / f"{run_name}.log"
                log_path.parent.mkdir(parents=True, exist_ok=True)
                out = log_path.open("a")
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
            if proc.returncode and job in stopped:
                # checkpointed at the time limit (exit 75), or signalled before its handler
                # was installed: either way the next slice resumes or restarts it
                continue
            if proc.returncode:
                failed.append(job)
            else:
                bar.update(1)
    bar.close()
    minutes = (time.perf_counter() - started) / 60
    done = f"{bar.n}/{len(jobs)} runs finished in {minutes:.1f} min"
    if bar.n < len(jobs) and not failed:
        print(f"sweep {name}: {done}; stopped at the time limit: run the same command again")
        return EXIT_PREEMPTED  # EX_TEMPFAIL: not done, nothing wrong, try again
    if failed:
        print(f"sweep {name}: {done}; failed: " + "; ".join(" ".join(j) for j in failed))
        return 1
    print(f"sweep {name}: {done}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    shipped = ", ".join(sorted(p.stem for p in SWEEPS.glob("*.yaml")))
    parser.add_argument("sweep", help=f"a file in configs/sweep/: {shipped}")
    parser.add_argument("overrides", nargs="*", help="appended to every job")
    parser.add_argument(
        "--launcher",
        default="submitit_slurm",
        choices=["submitit_slurm", "submitit_local", "basic"],
    )
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--stop-after",
        type=float,
        metavar="MINUTES",
        help="basic launcher: checkpoint and stop the running jobs after this long (rerun resumes)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="basic launcher: only the jobs whose config has this value (repeatable)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="basic launcher: jobs at once, sharing the cores (logs in runs/sweep-logs/)",
    )
    args = parser.parse_intermixed_args(argv)  # overrides may follow --launcher
    if args.stop_after is not None and args.launcher != "basic":
        parser.error("--stop-after slices a sweep run here: it needs --launcher basic")
    if args.only and args.launcher != "basic":
        parser.error("--only picks jobs to run here: it needs --launcher basic")
    sweep = load_sweep(args.sweep)
    if "tuned_by" in sweep and args.dry_run:
        print(
            "the rate per activation and optimizer: the best of the sweep "
            f"{sweep['tuned_by']!r} at the base width, read from its finished runs when this "
            "sweep is launched"
        )
    try:
        if "tuned_by" in sweep and not args.dry_run:
            rates = tuned_rates(sweep, args.overrides)
            sweep = with_tuned_rates(sweep, rates, args.overrides)
        jobs = expand(sweep, args.overrides)
        if args.only:
            jobs = [job for job in jobs if has_values(job, args.only)]
            if not jobs:
                raise SystemExit(f"sweep {args.sweep}: no job has {' '.join(args.only)}")
        if not args.dry_run:
            check_run_dirs(jobs)
        elif "tuned_by" not in sweep:  # a tuned sweep's directories name the rates to come
            check_run_dirs([with_unread_paths(job) for job in jobs])  # a dry run reads no data
    except ValueError as error:  # a job that does not compose: one line, naming the key
        raise SystemExit(
            f"sweep {args.sweep}: {error} (settings for every job go after the sweep's "
            "name, e.g. data.paths='[/data/*.parquet]')"
        ) from None
    if args.launcher == "basic":
        if args.dry_run:
            print(f"{len(jobs)} jobs, run one after another:")
            for job in jobs:
                print("$ train.py " + " ".join(job))
            return 0
        return run_locally(args.sweep, jobs, args.parallel, args.stop_after)
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
