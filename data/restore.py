"""A training loader resumed from a checkpoint: as it was, or re-partitioned over a new layout.

The checkpoint hands over every rank's data state, as each rank's ``loader.state_dict()`` was
saved, and nothing else; what they mean is decided here. On the same streams (as many ranks,
each with as many DataLoader workers) this rank takes its own state. On any other layout the
source re-partitions every old stream's position (``data.repartition``), and each of this
rank's workers starts from its own stream's new state (``ResumableStream.load_streams``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from data.repartition import CannotRepartitionError
from data.sources import get_source

log = logging.getLogger(__name__)


def needs_every_rank(loader, written_by: int, own: dict | None) -> bool:
    """Whether resuming ``loader`` from a checkpoint that ``written_by`` ranks wrote (this
    rank's saved state: ``own``, None if it had none) needs every rank's state: a re-partition
    does, resuming the same streams (as many ranks, each with as many workers) needs only
    ``own``. The checkpoint then reads one rank file per rank, not all of them on every rank."""
    same_streams = written_by == loader.dataset.world_size and own is not None
    return not (same_streams and _num_workers(own) == loader.num_workers)


def restore_loader(loader, every_rank: Sequence[dict]) -> None:
    """Resume a ``data.build_loader`` loader, not yet iterated, from ``every_rank``: the data
    state of every rank that wrote the checkpoint, in rank order. A source that cannot be
    re-partitioned raises ``CannotRepartitionError``, saying what to do instead."""
    dataset = loader.dataset
    workers = loader.num_workers
    own = every_rank[dataset.rank] if len(every_rank) == dataset.world_size else None
    if not needs_every_rank(loader, len(every_rank), own):
        loader.load_state_dict(own)
        return
    old = [stream for rank_state in every_rank for stream in _stream_states(rank_state)]
    per_rank = max(workers, 1)
    n_new = dataset.world_size * per_rank
    source = get_source(dataset.config.source)
    layout = (
        f"the checkpoint's data was read by {len(every_rank)} ranks x "
        f"{_num_workers(every_rank[0])} workers and this run has {dataset.world_size} x {workers}"
    )
    if source.repartition is None:
        raise CannotRepartitionError(
            f"{layout}, and data.source={source.name} cannot re-partition its position; "
            "resume with the original world size and data.num_workers"
        )
    try:
        new = source.repartition(dataset.config, old, n_new)
    except CannotRepartitionError as error:
        raise CannotRepartitionError(f"{layout}: {error}") from None
    if dataset.rank == 0:
        log.info("%s: every stream's position is re-partitioned", layout)
    mine = range(dataset.rank * per_rank, (dataset.rank + 1) * per_rank)
    dataset.load_streams({stream: new[stream] for stream in mine})


def _num_workers(loader_state: dict) -> int:
    """``data.num_workers`` of the loader that saved ``loader_state``."""
    snapshot = loader_state.get("_snapshot")
    return snapshot["_main_snapshot"]["_num_workers"] if snapshot else 0


def _stream_states(loader_state: dict) -> list[dict | None]:
    """The state of each of a loader's streams, in worker order (None: not started)."""
    if not (workers := _num_workers(loader_state)):
        return [loader_state["dataset_state"]["pending"]]
    snapshots = loader_state["_snapshot"]["_worker_snapshots"]
    return [snapshots[f"worker_{w}"]["dataset_state"]["pending"] for w in range(workers)]
