"""Checkpoints that resume bit-exactly and survive a crash in the middle of being written.

Layout of ``<run_dir>/checkpoints/step_000120/``:

- the model and optimizer through ``torch.distributed.checkpoint`` (each rank writes its own
  shards under FSDP; one copy under DDP or single-process),
- ``rank_00000.pt`` per rank: data-pipeline state and RNG (each rank reads its own; a run with
  another world size reads every rank's data state and re-partitions it, ``data.repartition``),
- ``trainer.json``: step, tokens seen, counters (identical on every rank, written by rank 0),
- ``config.yaml``: the resolved config of the run that wrote it.

Everything is first written to ``step_000120.tmp``; after every rank has finished, rank 0
renames it (``training.checkpoint_writer``, synchronously or in the background). A directory
without the suffix is therefore complete, and a crash during a save leaves the previous
checkpoint as the newest loadable one.

Loading runs no code from the files (``training.safe_load``): a checkpoint is data. One that
was published but cannot be loaded anyway (a disk that lost a shard, a file someone edited) is
set aside as ``step_000120.corrupt`` by :func:`load_latest`, which resumes from the one before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from data.repartition import EVERY_RANK
from training import distributed
from training.distributed import Env
from training.safe_load import dcp_load, load_weights_only

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d{6,})$")


class NoLoadableCheckpointError(RuntimeError):
    """Checkpoints exist and none of them loads: never silently start over from step 0."""

    def __init__(self, run_dir: str | Path, failures: list[tuple[Path, str]], consequence: str):
        listing = "\n".join(f"  {path.name}: {reason}" for path, reason in failures)
        super().__init__(
            f"{run_dir}: none of its {len(failures)} checkpoints can be loaded; {consequence}. "
            f"Why each failed:\n{listing}"
        )


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


def flush_to_disk(f) -> None:
    """fsync before the rename publishes the checkpoint, so a node crash cannot leave a
    published checkpoint with truncated files (DCP syncs its own shards)."""
    f.flush()
    os.fsync(f.fileno())


def rng_state() -> dict:
    """Every RNG's state as tensors and plain python values, so that the rank file loads with
    ``torch.load(weights_only=True)`` (numpy's own state holds an ndarray, which does not)."""
    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),  # (version, tuple of 625 ints, gauss_next): plain already
        "numpy": {
            "bit_generator": str(bit_generator),
            "key": torch.from_numpy(key.astype(np.int64)),  # uint32 words, widened losslessly
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state((n["bit_generator"], key, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class OtherRankFailedError(RuntimeError):
    """Raised on the ranks that loaded their part fine when another rank did not, so that every
    rank takes the same decision; ``damage`` says which (see :func:`is_damage`)."""

    def __init__(self, message: str, damage: bool) -> None:
        super().__init__(message)
        self.damage = damage


def is_damage(error: Exception) -> bool:
    """Whether a failed load means the checkpoint's files are bad (so the previous checkpoint
    may do), rather than this run's setup or machine (where every checkpoint fails alike)."""
    if isinstance(error, OtherRankFailedError):
        return error.damage
    return not isinstance(error, (MemoryError, torch.OutOfMemoryError))


def _on_every_rank(env: Env, stage: Callable[[], Any]) -> Any:
    """Run one stage of a load on every rank; when it fails anywhere, it raises everywhere."""
    try:
        result, error = stage(), None
    except Exception as failure:
        result, error = None, failure
    outcome = 0 if error is None else 1 if is_damage(error) else 2
    outcomes = [0.0] * env.world_size
    outcomes[env.rank] = outcome
    outcomes = distributed.all_reduce_sum(outcomes, env.device)
    worst = max(outcomes)
    if worst == 0:
        return result
    if error is not None and outcome == worst:
        raise error
    ranks = ", ".join(str(rank) for rank, o in enumerate(outcomes) if o == worst)
    raise OtherRankFailedError(f"rank {ranks} could not load its part (see its log)", worst == 1)


def _written_by(path: Path) -> int | None:
    """How many processes wrote the checkpoint, as any readable rank file says (None: none)."""
    for other in sorted(path.glob("rank_*.pt")):
        with contextlib.suppress(Exception):
            return int(load_weights_only(other, other)["world_size"])
    return None


def _every_rank_data(path: Path, written_by: int) -> list:
    """The data state of every rank that wrote the checkpoint, in rank order."""
    states = []
    for rank in range(written_by):
        rank_file = path / f"rank_{rank:05d}.pt"
        if not rank_file.is_file():
            raise FileNotFoundError(
                f"{path} was written by {written_by} processes and {rank_file.name} is "
                "missing: a resume on another world size or number of data workers needs the "
                "data state of every rank"
            )
        extra = load_weights_only(rank_file, rank_file)
        if extra["world_size"] != written_by:
            raise ValueError(
                f"{path}: {rank_file.name} says {extra['world_size']} processes wrote the "
                f"checkpoint, another rank file says {written_by}"
            )
        states.append(extra["data"])
    return states


def data_states(path: Path, env: Env) -> list:
    """Every rank's data state of the checkpoint ``path`` (written by as many processes as this
    run has), read on every rank: what ``data.restore_loader`` needs to re-partition the data
    when only ``data.num_workers`` changed. Every rank calls it; a failure raises everywhere."""
    return _on_every_rank(env, lambda: _every_rank_data(path, env.world_size))


def _rank_state(path: Path, env: Env) -> dict:
    """This rank's RNG state and data state: its own rank file's when the checkpoint was
    written by as many processes as this run has. Written by another number, the data state is
    ``{"every_rank": [...]}``, every old rank's, from which ``data.restore_loader`` computes
    this rank's (``data.repartition``; the model and optimizer reshard through DCP), and the
    RNG is this rank's file's when the old run had this rank, else None (left as seeded)."""
    rank_file = path / f"rank_{env.rank:05d}.pt"
    own = load_weights_only(rank_file, rank_file) if rank_file.is_file() else None
    written_by = int(own["world_size"]) if own is not None else _written_by(path)
    if own is not None and written_by == env.world_size:
        return own
    if written_by is None or written_by == env.world_size:
        raise FileNotFoundError(
            f"{path} has no state for rank {env.rank}: {rank_file.name} is missing (the "
            f"checkpoint has {len(list(path.glob('rank_*.pt')))} rank files and was written by "
            f"{written_by or 'an unknown number of'} processes)"
        )
    if env.is_main:
        log.info(
            "%s was written by %d processes and this run has %d: the data position of every "
            "rank is re-partitioned over this run's",
            path,
            written_by,
            env.world_size,
        )
    return {
        "data": {EVERY_RANK: _every_rank_data(path, written_by)},
        "rng": own["rng"] if own is not None else None,
        "world_size": written_by,
    }


def load(path: Path, model, optimizer, env: Env) -> tuple[dict, dict]:
    """Restore model, optimizer and RNG in place from the checkpoint ``path``; return
    (trainer state, data state), the data state for ``data.restore_loader``.

    The checkpoint may have been written by another number of processes: the model and
    optimizer reshard through DCP, and the data state is then every old rank's (see
    :func:`_rank_state`). Every rank calls it, and when any rank fails every rank raises (see
    :func:`is_damage` for what the error means). Nothing in the files runs code
    (``training.safe_load``). A failure may leave the model and optimizer partly overwritten;
    a later successful load overwrites all of it: DCP's planner is strict, so every tensor and
    every param-group value of the model and optimizer state dicts is read from the checkpoint.
    """
    extra = _on_every_rank(env, lambda: _rank_state(path, env))
    trainer_state = _on_every_rank(env, lambda: json.loads((path / "trainer.json").read_text()))
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}

    def read_shards() -> None:
        with single_process_is_intended():
            dcp_load(state, path)

    def restore() -> None:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=StateDictOptions(strict=True),
        )
        if extra["rng"] is not None:
            set_rng_state(extra["rng"])

    _on_every_rank(env, read_shards)
    _on_every_rank(env, restore)
    return trainer_state, extra["data"]


def set_aside(path: Path, env: Env) -> Path:
    """Rename a checkpoint that does not load ``step_N.corrupt`` (rank 0, after every rank
    agreed): it no longer counts as published and stays on disk for a post-mortem."""
    target = path.with_name(f"{path.name}.corrupt")
    if env.is_main:
        n = 1
        while target.exists():  # the same step went bad before
            n += 1
            target = path.with_name(f"{path.name}.corrupt.{n}")
        try:
            path.rename(target)
            log.warning("renamed %s to %s", path, target.name)
        except OSError as error:  # a read-only file system: the next resume tries it again
            log.error("could not rename %s to %s: %s", path, target.name, error)
    distributed.barrier()
    return target


def load_latest(run_dir: str | Path, model, optimizer, env: Env) -> tuple[Path, dict, dict] | None:
    """Resume from the newest checkpoint that loads: what ``Trainer._resume`` calls.

    Tries the published checkpoints newest first (:func:`load`: model, optimizer and RNG in
    place; every rank takes the same decision). One that does not load on some rank (a
    truncated shard, a missing rank file, unreadable or refused metadata...) is logged with the
    reason and the one before it is tried; whatever the failed attempt wrote into the model and
    optimizer, the next load overwrites. Once one loads, those that did not are renamed
    ``step_N.corrupt`` (:func:`set_aside`), so the next resume does not try them again.

    Returns (checkpoint path, trainer state, data state), or None when the run has no
    checkpoint (a fresh start). Never a silent restart from step 0: when checkpoints exist and
    none loads, it raises :class:`NoLoadableCheckpointError` listing each and why, and renames
    nothing (a requeued job then fails the same way instead of finding no checkpoint). Errors
    that are not damage (:func:`is_damage`: out of memory) propagate at once.
    """
    failures: list[tuple[Path, str]] = []
    for path in reversed(complete_checkpoints(run_dir)):
        try:
            trainer_state, data_state = load(path, model, optimizer, env)
        except Exception as error:
            if not is_damage(error):
                raise
            reason = f"{type(error).__name__}: {error}"
            if env.is_main or not isinstance(error, OtherRankFailedError):
                log.warning("%s cannot be loaded: %s", path, reason)
            failures.append((path, reason))
            continue
        for damaged, _ in failures:
            set_aside(damaged, env)
        return path, trainer_state, data_state
    if failures:
        raise NoLoadableCheckpointError(run_dir, failures, "refusing to start over from step 0")
    return None
