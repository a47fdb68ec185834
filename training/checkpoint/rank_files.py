"""The per-rank files of a checkpoint: each rank's data state and RNG, read for a resume.

A rank file that is missing or cannot be read is damage (``DamagedCheckpointError``): the
checkpoint lost part of what was written. An I/O error that may pass propagates as it is, for
the caller to retry.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from training.checkpoint.layout import RANK_FILES, rank_file
from training.checkpoint.unpickling import load_weights_only
from training.errors import DamagedCheckpointError, UnsafeCheckpointError
from training.runtime.distributed import Env

log = logging.getLogger(__name__)

# (ranks that wrote the checkpoint, this rank's saved data state or None) -> whether the data
# pipeline needs every rank's state (``data.needs_every_rank``); None: assume it does
NeedsEveryRank = Callable[[int, Any], bool] | None


def read_rank_file(file: Path) -> dict:
    try:
        return load_weights_only(file, file)
    except FileNotFoundError:
        raise DamagedCheckpointError(f"{file} is missing") from None
    except (OSError, UnsafeCheckpointError):  # may pass (retried); refused, naming the file
        raise
    except Exception as error:  # truncated or garbled
        raise DamagedCheckpointError(
            f"{file} cannot be read ({type(error).__name__}: {error})"
        ) from error


def _written_by(path: Path) -> int | None:
    """How many processes wrote the checkpoint, as any readable rank file says (None: none)."""
    for other in sorted(path.glob(RANK_FILES)):
        with contextlib.suppress(Exception):
            return int(load_weights_only(other, other)["world_size"])
    return None


class EveryRankData(Sequence):
    """The data state of every rank that wrote a checkpoint, in rank order, each read from its
    rank file when first asked for.

    A resume on the same layout needs only its own rank's (which :func:`read_rank_files` has
    read already): 256 ranks reading all 256 rank files each would be 65,536 reads on the
    shared file system at every requeue. When the data pipeline says it needs them all (another
    world size or ``data.num_workers``: a re-partition), :func:`read_rank_files` reads them up
    front, in the stage whose failure every rank agrees on.
    """

    def __init__(self, path: Path, written_by: int, read: dict[int, dict]) -> None:
        self.path, self.written_by = path, written_by
        for rank in range(written_by):  # a stat each: a checkpoint that lost one is damaged
            if rank not in read and not rank_file(path, rank).is_file():
                raise DamagedCheckpointError(
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
            self._states[rank] = self._checked(rank, read_rank_file(rank_file(self.path, rank)))
        return self._states[rank]

    def _checked(self, rank: int, extra: dict) -> dict:
        if extra["world_size"] != self.written_by:
            raise DamagedCheckpointError(
                f"{self.path}: {rank_file(self.path, rank).name} says {extra['world_size']} "
                f"processes wrote the checkpoint, another rank file says {self.written_by}"
            )
        return extra["data"]


def read_rank_files(
    path: Path, env: Env, needs_every_rank: NeedsEveryRank = None
) -> tuple[dict | None, EveryRankData]:
    """This rank's RNG state and every rank's data state. The RNG is this rank's file's, or
    None (left as seeded) when the run that wrote the checkpoint had no such rank; its model
    and optimizer then reshard through DCP."""
    own_file = rank_file(path, env.rank)
    own = read_rank_file(own_file) if own_file.is_file() else None
    written_by = int(own["world_size"]) if own is not None else _written_by(path)
    if own is None and (written_by is None or written_by == env.world_size):
        raise DamagedCheckpointError(
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
