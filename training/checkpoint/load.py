"""Loading a checkpoint to resume: every rank takes the same decision, and damage is told apart.

A published checkpoint may still not load, for two kinds of reason that call for opposite
answers:

- **its bytes are damaged**: a disk that lost a shard, a rank file someone deleted, a file that
  is not the one written (``training.checkpoint.integrity`` holds the evidence: checksums
  recorded at save time, or for older checkpoints what their metadata says). Then the one before
  may do: :func:`load_latest` tries it, and its caller sets the damaged ones aside as
  ``step_N.corrupt`` (:func:`set_aside`) once the run is sure to start.
- **its bytes are intact and this run cannot use them**: another model width, a setting a
  resume may not change, software that reads the format otherwise. Every older checkpoint
  would fail alike, and setting intact checkpoints aside loses work: the load stops with
  :class:`IncompatibleCheckpointError`, which names what differs, and nothing is renamed.

It never starts over silently: when checkpoints exist and none loads, it raises
:class:`NoLoadableCheckpointError`. Nothing in the files runs code
(``training.checkpoint.unpickling``). What is handed back of the data pipeline is every rank's
data state, as each was saved, for ``data.restore_loader`` to interpret.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.checkpoint import integrity
from training.checkpoint.layout import (
    TRAINER_FILE,
    complete_checkpoints,
    single_process_is_intended,
)
from training.checkpoint.optimizer_state import (
    changed_settings,
    load_template,
    own_settings_by_name,
    restore,
    saved_settings,
)
from training.checkpoint.rank_files import EveryRankData, NeedsEveryRank, read_rank_files
from training.checkpoint.rng import set_rng_state
from training.checkpoint.unpickling import dcp_load
from training.errors import (
    ConfigError,
    DamagedCheckpointError,
    IncompatibleCheckpointError,
    NoLoadableCheckpointError,
    OtherRankFailedError,
    UnsafeCheckpointError,
)
from training.runtime import distributed
from training.runtime.distributed import Env

log = logging.getLogger(__name__)


def is_damage(error: BaseException) -> bool:
    """Whether a failed load has evidence that the checkpoint's bytes are bad (so the previous
    checkpoint may do), rather than a run or a machine that cannot use intact bytes."""
    if isinstance(error, OtherRankFailedError):
        return error.damage
    # a pickle the trainer never writes: the file is not the one that was written
    return isinstance(error, (DamagedCheckpointError, UnsafeCheckpointError))


# an I/O error that may pass (EIO, ESTALE, a timeout from an NFS or Lustre server), unlike a
# file that is not there or may not be read
_PERSISTENT_OS_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
IO_RETRIES = 3  # tries of the same checkpoint after the first, 1, 2 and 4 s apart


def is_transient(error: BaseException) -> bool:
    """Whether a failed load may succeed if tried again: an OSError from the file system,
    other than a missing or forbidden file. Retried before the checkpoint counts as damaged."""
    if isinstance(error, OtherRankFailedError):
        return error.transient
    return isinstance(error, OSError) and not isinstance(error, _PERSISTENT_OS_ERRORS)


def _on_every_rank(env: Env, stage: Callable[[], Any]) -> Any:
    """Run one stage of a load on every rank; when it fails anywhere, it raises everywhere, the
    most telling failure winning: damage, then an I/O error worth retrying, then the rest."""
    try:
        result, error = stage(), None
    except Exception as failure:
        result, error = None, failure
    outcome = 0
    if error is not None:
        outcome = 3 if is_damage(error) else 2 if is_transient(error) else 1
    outcomes = [0.0] * env.world_size
    outcomes[env.rank] = outcome
    outcomes = distributed.all_reduce_sum(outcomes, env.device)
    worst = max(outcomes)
    if worst == 0:
        return result
    if error is not None and outcome == worst:
        raise error
    ranks = ", ".join(str(rank) for rank, o in enumerate(outcomes) if o == worst)
    raise OtherRankFailedError(
        f"rank {ranks} could not load its part (see its log)", worst == 3, worst == 2
    )


@dataclass
class Loaded:
    """What a load hands back besides the model and optimizer it filled in place."""

    trainer_state: dict
    data_states: EveryRankData
    changed_settings: list[str] = field(default_factory=list)


def load(
    path: Path,
    model,
    optimizer,
    env: Env,
    needs_every_rank: NeedsEveryRank = None,
    accept: Callable[[Path], None] | None = None,
) -> Loaded:
    """Restore model, optimizer and RNG in place from the checkpoint ``path``.

    First its bytes are checked (``training.checkpoint.integrity``), then ``accept(path)`` may
    refuse it (the trainer compares the run's config with the checkpoint's), then it is read.
    The checkpoint may have been written by another number of processes: the model and the
    optimizer's moments reshard through DCP, the optimizer's settings are this run's
    (``training.checkpoint.optimizer_state``), and every rank's data state goes back for the
    data pipeline. Every rank calls it, and when any rank fails every rank raises (see
    :func:`is_damage`). A failure may leave the model and optimizer partly overwritten; a later
    successful load overwrites all of it (DCP's planner is strict). ``needs_every_rank``:
    whether the data pipeline needs the other ranks' data states too (read then, while every
    rank agrees), or only this rank's.
    """
    _on_every_rank(env, lambda: integrity.verify(path, env))
    if accept is not None:
        _on_every_rank(env, lambda: accept(path))
    rng, data_states = _on_every_rank(env, lambda: read_rank_files(path, env, needs_every_rank))
    trainer_state = _on_every_rank(env, lambda: json.loads((path / TRAINER_FILE).read_text()))
    state, own_settings = load_template(model, optimizer)

    def read_shards() -> None:
        with single_process_is_intended():
            dcp_load(state, path)

    def put_back() -> None:
        restore(model, optimizer, state, own_settings)
        if rng is not None:
            set_rng_state(rng)

    _on_every_rank(env, read_shards)
    _on_every_rank(env, put_back)
    saved = _on_every_rank(env, lambda: saved_settings(path))
    changes = changed_settings(saved, own_settings_by_name(own_settings))
    return Loaded(trainer_state, data_states, changes)


def set_aside(path: Path, env: Env) -> Path:
    """Rename a damaged checkpoint ``step_N.corrupt`` (rank 0, after every rank agreed): it no
    longer counts as published and stays on disk for a post-mortem."""
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


def _load_retrying_io_errors(path: Path, model, optimizer, env: Env, **kwargs) -> Loaded:
    """:func:`load`, tried again after a transient I/O error (:func:`is_transient`): a file
    server's hiccup must not set a good checkpoint aside as damaged. One that does not pass is
    evidence enough: the checkpoint's bytes cannot be read."""
    for attempt in range(IO_RETRIES + 1):
        try:
            return load(path, model, optimizer, env, **kwargs)
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt == IO_RETRIES:
                raise DamagedCheckpointError(
                    f"{path} could not be read after {IO_RETRIES} retries: {error}"
                ) from error
            wait = 2**attempt
            log.warning("%s: I/O error (%s); trying again in %d s", path, error, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


@dataclass
class Resumed(Loaded):
    """:class:`Loaded`, with the checkpoint that loaded and the newer ones that are damaged
    (for the caller to :func:`set_aside` once nothing else can refuse the run)."""

    path: Path = Path()
    damaged: list[Path] = field(default_factory=list)


def load_latest(
    run_dir: str | Path,
    model,
    optimizer,
    env: Env,
    needs_every_rank: NeedsEveryRank = None,
    accept: Callable[[Path], None] | None = None,
) -> Resumed | None:
    """Resume from the newest checkpoint that loads: what ``Trainer._resume`` calls.

    Tries the published checkpoints newest first (:func:`load`: model, optimizer and RNG in
    place; every rank takes the same decision). One whose bytes are damaged is logged with the
    evidence and the one before it is tried; whatever the failed attempt wrote into the model
    and optimizer, the next load overwrites. Renames nothing: the damaged ones come back in
    :attr:`Resumed.damaged`. An I/O error that may pass is retried on the same checkpoint first
    (``IO_RETRIES`` times).

    Returns None when the run has no checkpoint (a fresh start). Raises what ``accept`` raises
    (a ConfigError), :class:`IncompatibleCheckpointError` when intact bytes do not load, and
    :class:`NoLoadableCheckpointError`, listing each and why, when every checkpoint is damaged:
    never a silent restart from step 0.
    """
    failures: list[tuple[Path, str]] = []
    for path in reversed(complete_checkpoints(run_dir)):
        try:
            loaded = _load_retrying_io_errors(
                path, model, optimizer, env, needs_every_rank=needs_every_rank, accept=accept
            )
        except Exception as error:
            if is_damage(error):
                reason = f"{type(error).__name__}: {error}"
                if env.is_main or not isinstance(error, OtherRankFailedError):
                    log.warning("%s cannot be loaded: %s", path, reason)
                failures.append((path, reason))
                continue
            if _is_the_runs_own(error):
                raise
            raise IncompatibleCheckpointError(path, error) from error
        damaged = [p for p, _ in failures]
        return Resumed(**vars(loaded), path=path, damaged=damaged)
    if failures:
        raise NoLoadableCheckpointError(run_dir, failures, "refusing to start over from step 0")
    return None


def _is_the_runs_own(error: BaseException) -> bool:
    """A failure that says nothing about the checkpoint: a refusal by ``accept`` (a
    ConfigError), this machine out of memory, or another rank's such failure."""
    if isinstance(error, OtherRankFailedError):
        return True
    return isinstance(error, (ConfigError, MemoryError, torch.OutOfMemoryError))
