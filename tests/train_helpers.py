"""Run the trainer in tests: tiny settings on real text, in-process or as a subprocess."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import fork_server

ROOT = Path(__file__).resolve().parents[1]
FORK_SERVER = ROOT / "tests" / "fork_server.py"
CONFIGS = ROOT / "configs"


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
        "trainer.checkpoint_every": 4,
        "trainer.eval_every": 6,
        "trainer.eval_batches": 2,
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
    from eval.downstream import during_training
    from training.loop import train

    return train(*compose(overrides), downstream=during_training, components=components)


TEST_ENVIRONMENT = {"OMP_NUM_THREADS": "1"}  # what every process the tests start gets


def server_address() -> str:
    """The socket of a fork server of this process for the tests' environment as it is now."""
    return fork_server.address(ROOT, {**os.environ, **TEST_ENVIRONMENT})


def launch(
    overrides: list[str],
    torchrun: int = 0,
    as_shipped: bool = False,
    forked: bool = True,
    **kwargs,
) -> subprocess.Popen:
    """``train.py`` as a subprocess; ``as_shipped``: without the tests' setting of the kernels
    (``XIELU_BACKEND=eager``), as a user runs it;
    ``forked``: each process (torchrun's agent, each rank) a fork of ``tests/fork_server.py``'s
    server rather than a fresh interpreter (that file says what differs, and which tests launch
    without it)."""
    forked = forked and not as_shipped  # a user's run starts a fresh interpreter
    python = [sys.executable, str(FORK_SERVER)] if forked else [sys.executable]
    if torchrun:
        cmd = [
            *python,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={torchrun}",
            "--standalone",  # a free port on this host
            *python[1:],  # each rank through the server too
            "train.py",
            *overrides,
        ]
    else:
        cmd = [*python, "train.py", *overrides]
    env = {**os.environ, **TEST_ENVIRONMENT, **kwargs.pop("env", {})}
    if forked:
        env[fork_server.ADDRESS] = server_address()
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


def run(overrides: list[str], torchrun: int = 0, timeout: float = 300, **kwargs):
    """(exit code, output) of a run; a run still going after ``timeout`` is a hang: its whole
    process group (torchrun's ranks and data workers too) is killed and the test fails with
    the output so far, instead of leaving orphans that slow every later test."""
    process = launch(overrides, torchrun, **kwargs)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts each rank in a session of its own: kill the whole tree
        kill_tree(process.pid)
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
