"""How work is split over ranks and DataLoader workers: one rule, used by every source.

Training: rank ``r``'s DataLoader worker ``w`` (of ``W``) is stream ``r * W + w`` of
``n = world_size * W`` (rank-major, so a rank's workers are consecutive streams), and stream
``s`` owns the items ``i`` with ``i % n == s``: fragments, rows, windows or bad files.
Validation: every rank builds the same windows and keeps those with ``i % world_size == rank``
(``data.validation``). A resume on another layout moves positions between streams by the rule
of ``data.repartition``.
"""

from __future__ import annotations

from torch.utils.data import get_worker_info


def worker_stream(rank: int, world_size: int) -> tuple[int, int]:
    """(stream id, number of streams) of the calling DataLoader worker (or main process)."""
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info else (1, 0)
    return rank * workers + worker, world_size * workers


def owns(index: int, stream: int, streams: int) -> bool:
    """Whether item ``index`` belongs to ``stream`` of ``streams``."""
    return index % streams == stream


def share(items, stream: int, streams: int):
    """The items (a sequence or array) that ``stream`` owns, in order."""
    return items[stream::streams]
