"""DataLoaders for training (endless, resumable) and validation (finite, deterministic), the
resume of a training loader from a checkpoint (on the same or another world size x workers),
and the pipeline's counters read back from a training loader's state."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable

from torch.utils.data import DataLoader, IterableDataset

from data.config import DataConfig
from data.registry import get_source
from data.repartition import EVERY_RANK, CannotRepartitionError
from data.sharding import deal

# Always reported by ``counters``, so every rank all-reduces the same keys.
COUNTERS = (
    "documents",  # documents packed into training windows (text sources)
    "tokens",  # their tokens, BOS/EOS included (text sources); windows x seq_len (tokenized)
    "windows",  # training windows yielded (tokenized)
    "bad_records",  # not UTF-8 / JSON, no text field, or text not a string
    "empty_documents",  # empty or whitespace-only text
    "filtered_documents",  # below data.min_int_score
    "bad_files",  # unreadable files or row groups, or files that stop early
    "skipped",  # records without usable text (fineweb_edu)
)


def build_loader(config: DataConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """A ``StatefulDataLoader``: ``state_dict()`` / ``load_state_dict()`` resume exactly.

    Each worker is its own stream (see ``data.sharding``); the loader's state holds every
    worker's position and which worker's batch comes next.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    # torchdata calls a torch API that torch has deprecated; nothing for a user to act on
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

    return StatefulDataLoader(
        get_source(config.source).training(config, rank, world_size),
        batch_size=batch_size,
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
        snapshot_every_n_steps=1,
    )


def restore_loader(loader, state: dict, every_rank: Callable[[], list[dict]] | None = None) -> None:
    """Resume a ``build_loader`` loader, not yet iterated, from a checkpoint's data state.

    ``state`` is what ``training.checkpoint.load`` returns: this rank's ``loader.state_dict()``
    when the checkpoint was written by as many processes, else ``{"every_rank": [...]}``, the
    state of every rank that wrote it. On the same streams (world size x workers) the loader
    resumes as it was. On other streams, the source re-partitions every old stream's position
    (``data.repartition``) and each of this rank's workers starts from its own stream's new
    state (``ResumableStream.load_streams``); when only ``data.num_workers`` changed, this needs
    ``every_rank()``, which returns every old rank's state. A source that cannot be
    re-partitioned raises ``CannotRepartitionError``, saying what to do instead.
    """
    dataset = loader.dataset
    workers = loader.num_workers
    if EVERY_RANK in state:
        old_ranks = state[EVERY_RANK]
    elif _num_workers(state) == workers:
        loader.load_state_dict(state)
        return
    elif every_rank is None:
        raise ValueError(
            f"the checkpoint's data was read with data.num_workers={_num_workers(state)} and "
            f"this run has {workers}: re-partitioning needs every rank's data state (every_rank)"
        )
    else:
        old_ranks = every_rank()
    old = [stream for rank_state in old_ranks for stream in _stream_states(rank_state)]
    per_rank = max(workers, 1)
    n_new = dataset.world_size * per_rank
    source = get_source(dataset.config.source)
    layout = (
        f"the checkpoint's data was read by {len(old_ranks)} ranks x "
        f"{_num_workers(old_ranks[0])} workers and this run has {dataset.world_size} x {workers}"
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


class ValidationStream(IterableDataset):
    """The held-out slice: the first ``validation_documents`` documents of the source.

    The same documents for every run, activation and world size. Every rank packs the whole
    slice the same way and keeps windows ``i % world_size == rank`` (the last, partial window
    padded with ignored targets), so the windows, and the token-weighted loss over them, do not
    depend on the world size.
    """

    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size

    def __iter__(self):
        windows = get_source(self.config.source).validation(self.config)
        return deal(windows, self.rank, self.world_size)


def build_validation_loader(
    config: DataConfig, batch_size: int, rank: int = 0, world_size: int = 1
) -> DataLoader:
    return DataLoader(ValidationStream(config, rank, world_size), batch_size=batch_size)


def counters(loader_state: dict) -> dict[str, int]:
    """The pipeline's counters on this rank, from ``build_loader(...).state_dict()``.

    Sums the ``stats`` of every worker's stream (each worker's state as of the last batch it
    delivered; with ``num_workers=0`` the one stream's). Counters are cumulative over the run,
    resumes included, and count the training part only: records in the held-out validation slice
    are never counted. Every name in ``COUNTERS`` is present (0 when a source does not count
    it), so the dicts of all ranks have the same keys and can be all-reduced as they are; the
    sum over ranks counts each record once. A counter that is not in ``COUNTERS`` is left out.
    """
    total = Counter(dict.fromkeys(COUNTERS, 0))
    for state in _dataset_states(loader_state):
        stats = (state.get("pending") or {}).get("stats") or {}
        total.update({k: int(v) for k, v in stats.items() if k in total})
    return dict(total)


def _dataset_states(state):
    """Every ``dataset_state`` in a StatefulDataLoader state (one per worker, or the main one)."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == "dataset_state" and isinstance(value, dict):
                yield value
            else:
                yield from _dataset_states(value)
