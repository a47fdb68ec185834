"""Loading a checkpoint to resume: every rank takes the same decision, and damage is survived.

A published checkpoint may still not load: a disk that lost a shard, a rank file someone
deleted or edited. :func:`load_latest` then logs why, tries the one before, and once one loads
renames the ones that did not ``step_N.corrupt`` (:func:`set_aside`), so that the next resume
does not try them again. It never starts over silently: when checkpoints exist and none loads,
it raises :class:`NoLoadableCheckpointError`. Nothing in the files runs code
(``training.checkpoint.unpickling``).

What is handed back of the data pipeline is every rank's data state, as each was saved; what
they mean (resume as saved, or re-partition over this run's layout) is the data pipeline's to
decide (``data.restore_loader``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from training.checkpoint.layout import (
    RANK_FILES,
    TRAINER_FILE,
    complete_checkpoints,
    rank_file,
    single_process_is_intended,
)
from training.checkpoint.rng import set_rng_state
from training.checkpoint.unpickling import dcp_load, load_weights_only
from training.runtime import distributed
from training.runtime.distributed import Env

log = logging.getLogger(__name__)


class NoLoadableCheckpointError(RuntimeError):
    """Checkpoints exist and none of them loads: never silently start over from step 0."""

    def __init__(self, run_dir: str | Path, failures: list[tuple[Path, str]], consequence: str):
        listing = "\n".join(f"  {path.name}: {reason}" for path, reason in failures)
        super().__init__(
            f"{run_dir}: none of its {len(failures)} checkpoints can be loaded; {consequence}. "
            f"Why each failed:\n{listing}"
        )


class OtherRankFailedError(RuntimeError):
    """Raised on the ranks that loaded their part fine when another rank did not, so that every
    rank takes the same decision; ``damage`` and ``transient`` say which (see
    :func:`is_damage`, :func:`is_transient`)."""

    def __init__(self, message: str, damage: bool, transient: bool = False) -> None:
        super().__init__(message)
        self.damage, self.transient = damage, transient


def is_damage(error: Exception) -> bool:
    """Whether a failed load means the checkpoint's files are bad (so the previous checkpoint
    may do), rather than this run's setup or machine (where every checkpoint fails alike)."""
    if isinstance(error, OtherRankFailedError):
        return error.damage
    return not isinstance(error, (MemoryError, torch.OutOfMemoryError))


# an I/O error that may pass (EIO, ESTALE, a timeout from an NFS or Lustre server), unlike a
# file that is not there or may not be read
_PERSISTENT_OS_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
IO_RETRIES = 3  # tries of the same checkpoint after the first, 1, 2 and 4 s apart


def is_transient(error: Exception) -> bool:
    """Whether a failed load may succeed if tried again: an OSError from the file system,
    other than a missing or forbidden file. Retried before the checkpoint counts as damaged."""
    if isinstance(error, OtherRankFailedError):
        return error.transient
    return isinstance(error, OSError) and not isinstance(error, _PERSISTENT_OS_ERRORS)


def _on_every_rank(env: Env, stage: Callable[[], Any]) -> Any:
    """Run one stage of a load on every rank; when it fails anywhere, it raises everywhere."""
    try:
        result, error = stage(), None
    except Exception as failure:
        result, error = None, failure
    # 0 loaded, 1 damage, 2 an I/O error worth retrying, 3 not the files' fault
    outcome = 0
    if error is not None:
        outcome = 3 if not is_damage(error) else 2 if is_transient(error) else 1
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
        f"rank {ranks} could not load its part (see its log)", worst in (1, 2), worst == 2
    )


def _written_by(path: Path) -> int | None:
    """How many processes wrote the checkpoint, as any readable rank file says (None: none)."""
    for other in sorted(path.glob(RANK_FILES)):
        with contextlib.suppress(Exception):
            return int(load_weights_only(other, other)["world_size"])
    return None


class EveryRankData(Sequence):
    """The data state of every rank that wrote a checkpoint, in rank order, each read from its
    rank file when first asked for.

    A resume on the same layout needs only its own rank's (which :func:`_rank_files` has read
    already): 256 ranks reading all 256 rank files each would be 65,536 reads on the shared
    file system at every requeue. When the data pipeline says it needs them all (another
    world size or ``data.num_workers``: a re-partition), :func:`_rank_files` reads them up
    front, in the stage whose failure every rank agrees on.
    """

    def __init__(self, path: Path, written_by: int, read: dict[int, dict]) -> None:
        self.path, self.written_by = path, written_by
        for rank in range(written_by):  # a stat each: a checkpoint that lost one is damaged
            if rank not in read and not rank_file(path, rank).is_file():
                raise FileNotFoundError(
                    f"{path} was written by {written_by} processes and "
                    f"{rank_file(path, rank).name} is missing: a resume needs the data state "
                    "of every rank"
                )
        self._states = {rank: self._checked(rank, extra) for rank, extra in read.items()}

    def __len__(self) -> int:
        return self.written_by

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return [self[i] for i in range(*rank.indices(len(self)))]
        if rank < 0:
            rank += len(self)
        if not 0 <= rank < len(self):
            raise IndexError(rank)
        if rank not in self._states:
            file = rank_file(self.path, rank)
            self._states[rank] = self._checked(rank, load_weights_only(file, file))
        return self._states[rank]

    def _checked(self, rank: int, extra: dict) -> dict:
        if extra["world_size"] != self.written_by:
            raise ValueError(
                f"{self.path}: {rank_file(self.path, rank).name} says {extra['world_size']} "
                f"processes wrote the checkpoint, another rank file says {self.written_by}"
            )
        return extra["data"]


# (ranks that wrote the checkpoint, this rank's saved data state or None) -> whether the data
# pipeline needs every rank's state (``data.needs_every_rank``); None: assume it does
NeedsEveryRank = Callable[[int, Any], bool] | None


def _rank_files(
    path: Path, env: Env, needs_every_rank: NeedsEveryRank = None
) -> tuple[dict | None, EveryRankData]:
    """This rank's RNG state and every rank's data state. The RNG is this rank's file's, or
    None (left as seeded) when the run that wrote the checkpoint had no such rank; its model
    and optimizer then reshard through DCP."""
    own_file = rank_file(path, env.rank)
    own = load_weights_only(own_file, own_file) if own_file.is_file() else None
    written_by = int(own["world_size"]) if own is not None else _written_by(path)
    if own is None and (written_by is None or written_by == env.world_size):
        raise FileNotFoundError(
            f"{path} has no state for rank {env.rank}: {own_file.name} is missing (the "
            f"checkpoint has {len(list(path.glob(RANK_FILES)))} rank files and was written by "
            f"{written_by or 'an unknown number of'} processes)"
        )
    if written_by != env.world_size and env.is_main:
        log.info(
            "%s was written by %d processes and this run has %d: the model and optimizer "
            "reshard, and every rank's data state goes to the data pipeline",
            path,
            written_by,
            env.world_size,
        )
    every_rank = EveryRankData(path, written_by, {env.rank: own} if own is not None else {})
    own_data = own["data"] if own is not None else None
    if needs_every_rank is None or needs_every_rank(written_by, own_data):
        list(every_rank)  # all of them are needed: read them while the ranks agree
    return (own["rng"] if own is not None else None), every_rank


def load(
    path: Path, model, optimizer, env: Env, needs_every_rank: NeedsEveryRank = None
) -> tuple[dict, EveryRankData]:
    """Restore model, optimizer and RNG in place from the checkpoint ``path``; return (trainer
    state, every rank's data state in rank order), the latter for ``data.restore_loader``.

    The checkpoint may have been written by another number of processes: the model and
    optimizer reshard through DCP. Every rank calls it, and when any rank fails every rank
    raises (see :func:`is_damage` for what the error means). Nothing in the files runs code
    (``training.checkpoint.unpickling``). A failure may leave the model and optimizer partly
    overwritten; a later successful load overwrites all of it: DCP's planner is strict, so
    every tensor and every param-group value of the model and optimizer state dicts is read
    from the checkpoint. ``needs_every_rank``: whether the data pipeline needs the other
    ranks' data states too (read then, while every rank agrees), or only this rank's.
    """
    rng, data_states = _on_every_rank(env, lambda: _rank_files(path, env, needs_every_rank))
    trainer_state = _on_every_rank(env, lambda: json.loads((path / TRAINER_FILE).read_text()))
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
        if rng is not None:
            set_rng_state(rng)

    _on_every_rank(env, read_shards)
    _on_every_rank(env, restore)
    return trainer_state, data_states


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


def _load_retrying_io_errors(
    path: Path, model, optimizer, env: Env, needs_every_rank: NeedsEveryRank
) -> tuple[dict, EveryRankData]:
    """:func:`load`, tried again after a transient I/O error (:func:`is_transient`): a file
    server's hiccup must not set a good checkpoint aside as damaged."""
    for attempt in range(IO_RETRIES + 1):
        try:
            return load(path, model, optimizer, env, needs_every_rank)
        except Exception as error:
            if attempt == IO_RETRIES or not (is_damage(error) and is_transient(error)):
                raise
            wait = 2**attempt
            log.warning("%s: I/O error (%s); trying again in %d s", path, error, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


def load_latest(
    run_dir: str | Path, model, optimizer, env: Env, needs_every_rank: NeedsEveryRank = None
) -> tuple[Path, dict, EveryRankData] | None:
    """Resume from the newest checkpoint that loads: what ``Trainer._resume`` calls.

    Tries the published checkpoints newest first (:func:`load`: model, optimizer and RNG in
    place; every rank takes the same decision). One that does not load on some rank (a
    truncated shard, a missing rank file, unreadable or refused metadata...) is logged with the
    reason and the one before it is tried; whatever the failed attempt wrote into the model and
    optimizer, the next load overwrites. Once one loads, those that did not are renamed
    ``step_N.corrupt`` (:func:`set_aside`), so the next resume does not try them again.

    Returns (checkpoint path, trainer state, every rank's data state), or None when the run has
    no checkpoint (a fresh start). Never a silent restart from step 0: when checkpoints exist
    and none loads, it raises :class:`NoLoadableCheckpointError` listing each and why, and
    renames nothing (a requeued job then fails the same way instead of finding no checkpoint).
    Errors that are not damage (:func:`is_damage`: out of memory) propagate at once; an I/O
    error that may pass is retried on the same checkpoint first (``IO_RETRIES`` times).
    ``needs_every_rank``: as for :func:`load`.
    """
    failures: list[tuple[Path, str]] = []
    for path in reversed(complete_checkpoints(run_dir)):
        try:
            trainer_state, data_states = _load_retrying_io_errors(
                path, model, optimizer, env, needs_every_rank
            )
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
        return path, trainer_state, data_states
    if failures:
        raise NoLoadableCheckpointError(run_dir, failures, "refusing to start over from step 0")
    return None
