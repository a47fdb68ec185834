"""Run the trainer in tests: tiny settings on real text, and the three ways a test starts a run.

- ``run_in_process``: the trainer in the test's own process (one rank; a test reads its
  objects or hands it components).
- ``run``: ``train.py``'s entry point on 1 or more ranks started from the test process, as
  torchrun starts them; where the test is about what a run does, not how it is launched.
- ``launch`` / ``run_launched``: ``python train.py`` or ``torchrun`` as a user types it, for
  the tests where the process boundary is what is tested: signals and kills from outside
  (the run-directory property), kill -9 of a rank, SLURM's script, README's command.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import multiprocessing
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def with_setting(config, dotted: str, value):
    """``config`` with one setting changed (``optim.muon.lr``), every section on the way built
    anew (``dataclasses.replace``), so that the changed section checks itself as composing
    would."""
    from dataclasses import replace

    head, _, rest = dotted.partition(".")
    if not rest:
        return replace(config, **{head: value})
    return replace(config, **{head: with_setting(getattr(config, head), rest, value)})


def tiny_overrides(corpus_dir: Path, run_dir: Path, **extra) -> list[str]:
    values = {
        "model.dim": 32,
        "model.n_layers": 2,
        "model.n_heads": 2,
        "model.gated_hidden": 64,
        "model.max_seq_len": 32,
        "data": "local",
        "data.paths": f"[{corpus_dir}/*.parquet]",
        "data.seq_len": 32,
        "data.num_workers": 0,
        "data.validation_documents": 8,
        "trainer.global_batch": 4,
        "trainer.micro_batch": 2,
        "trainer.steps": 12,
        "trainer.log_every": 1,
        "checkpoint.every": 4,
        "validation.every": 6,
        "validation.batches": 2,
        "schedule.warmup_steps": 2,
        "schedule.decay_steps": 4,
        "logging.wandb.mode": "disabled",
        "trainer.run_dir": str(run_dir),
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


# The tests that compose every point of the shipped sweeps (about 460, 0.15-0.25 s each) run on
# one worker (``pytest.mark.xdist_group(SWEEP_POINTS)``) with these data paths (local sources
# need some; none is read), so that ``training.sweeps.resolve``'s per-process cache composes each
# point once per suite rather than once per test.
SWEEP_POINTS = "sweep_points"
SWEEP_DATA = ["data.paths=[/x/*.parquet]"]


def compose(overrides: list[str]):
    """The ExperimentConfig and resolved YAML that ``train.py`` would build from overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from training.config import register_configs, to_experiment

    register_configs()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = hydra_compose("train", overrides)
    return to_experiment(cfg), OmegaConf.to_yaml(cfg, resolve=True)


def run_in_process(overrides: list[str], components=()) -> int:
    """``train.py``'s run in this process, with the same components it hands the trainer, and
    ``components`` added (``tests/faults.py``'s, for one)."""
    from eval.downstream import InTraining
    from training.loop import train

    return train(*compose(overrides), downstream=InTraining(), components=components)


TEST_ENVIRONMENT = {"OMP_NUM_THREADS": "1"}  # what every process the tests start gets
# Ranks started from the test process are forks of multiprocessing's fork server, which has
# imported train.py and what a run imports later (the compiler, lm-eval) once: a rank starts in
# milliseconds rather than the seconds an interpreter takes to import all of it
RANKS = multiprocessing.get_context("forkserver")
RANKS.set_forkserver_preload(
    ["train", "torch._dynamo", "torch._inductor.compile_fx", "lm_eval.evaluator", "lm_eval.tasks"]
)
TORCHRUN_GRACE_S = 30  # torchrun's: a failed rank's peers get SIGTERM, then SIGKILL after this


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(argv: list[str], env: dict[str, str], log: str) -> None:
    """One rank: ``python train.py ARGV`` as torchrun starts it (its own session, its rank in
    its environment, its output on the job's log), ending as that interpreter ends (atexit)."""
    os.setsid()  # its own process group with its data workers, as torchrun starts a rank
    multiprocessing.set_start_method(None, force=True)  # its data workers: a fresh one's default
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    sys.argv = ["train.py", *argv]
    try:  # as __main__ (Hydra finds configs/ beside the script), its imports already done
        runpy.run_path("train.py", run_name="__main__")
    finally:
        atexit._run_exitfuncs()


def run(
    overrides: list[str], ranks: int = 1, timeout: float = 300, env: dict | None = None
) -> tuple[int, str]:
    """(exit code, output) of ``train.py`` on ``ranks`` processes started from this one (gloo
    over localhost; one rank: no distributed environment, as ``python train.py``). The exit
    code is 0, or the first failed rank's; once one fails the others are stopped as torchrun
    stops them; the output ends with each rank's ``rank R exitcode : CODE``. Past ``timeout``
    the run is a hang: every rank's process group is killed and the test fails with the output
    so far."""
    base = {**os.environ, **TEST_ENVIRONMENT, **(env or {})}
    if ranks > 1:
        shared = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        shared.update(WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks))
        envs = [{**base, **shared, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(ranks)]
    else:
        envs = [base]
    with tempfile.NamedTemporaryFile("r", prefix="run-", suffix=".log") as log:
        processes = [RANKS.Process(target=_rank_main, args=(overrides, e, log.name)) for e in envs]
        for process in processes:
            process.start()
        code = _wait(processes, timeout)
        output = log.read()
    output += "".join(f"rank {r} exitcode : {p.exitcode}\n" for r, p in enumerate(processes))
    if code is None:
        raise AssertionError(f"the run hung for {timeout} s; its output:\n{output[-5000:]}")
    return code, output


def _wait(processes: list, timeout: float) -> int | None:
    """The job's exit code once every rank has ended; None (every rank killed) past timeout."""
    deadline, failed, stopping_since = time.monotonic() + timeout, None, None
    while any(p.is_alive() for p in processes):
        now = time.monotonic()
        if failed is None:
            failed = next((p.exitcode for p in processes if p.exitcode not in (None, 0)), None)
        if failed is not None and stopping_since is None:
            stopping_since = now
            _signal_groups(processes, signal.SIGTERM)
        if now > deadline or (stopping_since and now - stopping_since > TORCHRUN_GRACE_S):
            _signal_groups(processes, signal.SIGKILL)
            for process in processes:
                process.join()
            return failed if now <= deadline else None
        time.sleep(0.05)
    return failed or next((p.exitcode for p in processes if p.exitcode), 0)


def _signal_groups(processes: list, number: int) -> None:
    for process in processes:
        if process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, number)


def launch(
    overrides: list[str], torchrun: int = 0, as_shipped: bool = False, **kwargs
) -> subprocess.Popen:
    """``train.py`` as a user starts it, as a subprocess: ``python train.py`` or, with
    ``torchrun`` ranks, ``python -m torch.distributed.run --standalone``; for the tests where
    the process boundary is what is tested (signals from outside, kill -9, SLURM, README).
    ``as_shipped``: without the tests' setting of the kernels (``XIELU_BACKEND``)."""
    cmd = [sys.executable, "train.py", *overrides]
    if torchrun:  # --standalone: a rendezvous on a free port of this host
        cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "--standalone"]
    env = {**os.environ, **TEST_ENVIRONMENT, **kwargs.pop("env", {})}
    if as_shipped:
        env.pop("XIELU_BACKEND", None)
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a hung run is stopped whole
        **kwargs,
    )


def run_launched(overrides: list[str], torchrun: int = 0, timeout: float = 300, **kwargs):
    """(exit code, output) of ``launch``; past ``timeout`` a hang: its process tree (torchrun's
    ranks and their data workers too) is killed and the test fails with the output so far."""
    process = launch(overrides, torchrun, **kwargs)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)  # torchrun starts each rank in a session of its own
        output, _ = process.communicate(timeout=60)
        message = f"the run hung for {timeout} s; its output:\n{output[-5000:]}"
        raise AssertionError(message) from None
    return process.returncode, output


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (listed before any is killed: an orphan is
    no longer below it)."""
    for each in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(run_dir: Path) -> dict[int, float]:
    """Training loss per step (a resumed run logs some steps twice: the later one counts)."""
    return {m["step"]: m["loss"] for m in metrics(run_dir) if "loss" in m}


def assert_same_losses(run_dir: Path, expected: dict[int, float], rel: float = 1e-6) -> None:
    """Every step's loss as in ``expected`` (a resumed run's repeated steps: the later)."""
    import pytest

    got = losses(run_dir)
    assert got.keys() == expected.keys()
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=rel, abs=rel), step


def snapshot(directory: Path) -> dict[str, tuple[int, str] | None]:
    """Every file's size and hash and every folder (None), by path relative to ``directory``:
    what "the directory is byte for byte as it was" compares."""
    out: dict[str, tuple[int, str] | None] = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_file():
            out[name] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            out[name] = None
    return out
