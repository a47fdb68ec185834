"""Checkpoints that resume bit-exactly and survive a crash in the middle of being written.

Layout of ``<run_dir>/checkpoints/step_000120/``:

- the model and optimizer through ``torch.distributed.checkpoint`` (each rank writes its own
  shards under FSDP; one copy under DDP or single-process),
- ``rank_00000.pt`` per rank: data-pipeline state (each rank reads its own stream) and RNG,
- ``trainer.json``: step, tokens seen, counters (identical on every rank, written by rank 0),
- ``config.yaml``: the resolved config of the run that wrote it.

Everything is first written to ``step_000120.tmp``; after every rank has finished, rank 0
renames it. A directory without the suffix is therefore complete, and a crash during a save
leaves the previous checkpoint as the newest loadable one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from training import distributed
from training.distributed import Env

STEP_DIR = re.compile(r"^step_(\d{6,})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def step_of(checkpoint: Path) -> int:
    """The training step a published checkpoint directory holds."""
    return int(STEP_DIR.match(checkpoint.name).group(1))


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Published checkpoints, oldest first (``.tmp`` directories are never complete)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=step_of)


@contextlib.contextmanager
def single_process_is_intended():
    """DCP warns when no process group exists; single-process runs are meant to have none."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _flush_to_disk(f) -> None:
    """fsync before the rename publishes the checkpoint, so a node crash cannot leave a
    published checkpoint with truncated files (DCP syncs its own shards)."""
    f.flush()
    os.fsync(f.fileno())


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(
    run_dir: str | Path,
    step: int,
    model,
    optimizer,
    trainer_state: dict,
    data_state: dict,
    config_yaml: str,
    env: Env,
    keep: int,
    crash_before_publish: bool = False,
) -> Path:
    root = checkpoint_root(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f"{step_dir_name(step)}.tmp"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover from a crashed save
        tmp.mkdir(parents=True)
    distributed.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    with single_process_is_intended():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
    with open(tmp / f"rank_{env.rank:05d}.pt", "wb") as f:
        torch.save({"data": data_state, "rng": rng_state(), "world_size": env.world_size}, f)
        _flush_to_disk(f)
    if env.is_main:
        for name, text in (
            ("trainer.json", json.dumps(trainer_state, indent=2) + "\n"),
            ("config.yaml", config_yaml),
        ):
            with open(tmp / name, "w") as f:
                f.write(text)
                _flush_to_disk(f)
    distributed.barrier()
    if crash_before_publish:  # fault injection (trainer.debug_crash_in_checkpoint_at)
        os._exit(13)
    if env.is_main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def load(path: Path, model, optimizer, env: Env) -> tuple[dict, dict]:
    """Restore model, optimizer and RNG in place; return (trainer state, data state)."""
    rank_file = path / f"rank_{env.rank:05d}.pt"
    if not rank_file.is_file():
        written = len(list(path.glob("rank_*.pt")))
        raise ValueError(
            f"{path} has no state for rank {env.rank} ({written} rank files): if it was written "
            "by another number of processes, resume with that number; otherwise the checkpoint "
            "is damaged and the previous one in the same directory can be used by deleting it"
        )
    extra = torch.load(rank_file, weights_only=False)
    if extra["world_size"] != env.world_size:
        raise ValueError(
            f"{path} was written by {extra['world_size']} processes and this run has "
            f"{env.world_size}: the data pipeline cannot resume exactly; use the same world size"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with single_process_is_intended():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=StateDictOptions(strict=True),
    )
    set_rng_state(extra["rng"])
    trainer_state = json.loads((path / "trainer.json").read_text())
    return trainer_state, extra["data"]
