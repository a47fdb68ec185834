"""Exact resume for every training stream: a loaded state waits until iteration starts.

``StatefulDataLoader`` calls ``load_state_dict`` before the stream's ``__iter__`` runs (in the
worker process, when there are workers), and ``state_dict`` while the stream is suspended at a
``yield``. So a loaded state is kept *pending* and applied when iteration starts; from then on
``state_dict`` reads the *live* position the stream publishes. Both are wrapped as
``{"pending": state}``, so saving a stream that never ran returns what was loaded, unchanged.

A resume on another world size or number of workers (``data.repartition``) does not go through
the loader's ``load_state_dict``: ``data.restore.restore_loader`` hands the dataset one state per
stream of this rank (``load_streams``) before the loader starts its workers; each worker (or
the main process, without workers) takes its own stream's state, so the loader itself starts
fresh while every stream resumes.

A state carries the stream's identity (a fingerprint of the data, tokenizer, sequence length and
stream layout); a resume whose identity differs is refused instead of silently misaligned.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import IterableDataset

from data.partition import worker_stream
from data.source import DataError


def files_changed(saved: list[str], current: list[str]) -> str:
    """What differs between two ``data.paths.listing``s, in words."""
    sizes = [dict(entry.rsplit(":", 1) for entry in listing) for listing in (saved, current)]
    old, new = sizes
    parts = [f"added {name} ({new[name]} bytes)" for name in new if name not in old]
    parts += [f"removed {name}" for name in old if name not in new]
    parts += [
        f"{name} changed size ({old[name]} -> {new[name]} bytes)"
        for name in new
        if name in old and old[name] != new[name]
    ]
    return "; ".join(parts)


def check_same_identity(saved: dict, current: dict) -> None:
    """Refuse a resume whose data, tokenizer, sequence length or stream layout differ from the
    checkpoint's. ``files``, which checkpoints record since a refusal names them, is not
    compared when the checkpoint has none: the fingerprint (``source``) still is."""
    for key, value in current.items():
        if saved.get(key) == value or (key == "files" and key not in saved):
            continue
        if key == "files":
            raise DataError(
                f"cannot resume: the files data.paths matches changed since the checkpoint was "
                f"written: {files_changed(saved[key], value)}. Every stream's position is a "
                "place in those files, so a resume must read the same ones: restore them, or "
                "start a new run on the new files (another trainer.run_dir)"
            )
        if key == "n_streams":
            raise DataError(
                f"cannot resume the data pipeline: the checkpoint's data was read by "
                f"{saved.get(key)} streams (world size x workers) and this run has {value}; "
                "resume through data.restore_loader, which re-partitions the streams"
            )
        raise DataError(
            f"cannot resume the data pipeline: its {key} was {saved.get(key)!r} when the "
            f"checkpoint was written and is {value!r} now (a different dataset, tokenizer or "
            "sequence length); start a new run or restore the original setting"
        )


class ResumableStream(IterableDataset):
    """Base of the training streams: ``state_dict`` / ``load_state_dict`` and their timing.

    In ``__iter__`` a stream calls ``_resume(identity, stream)`` first (the saved state, checked
    against the identity and the stream it was saved by, or None for a fresh start) and then
    ``_publish(snapshot)`` with a function returning its current state, which must include
    ``"identity"`` and may include ``"stats"`` (its counters, read by ``data.counters``).
    """

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        self._pending: dict | None = None  # a loaded state, applied when iteration starts
        self._by_stream: dict[int, dict | None] = {}  # or one per stream (load_streams)
        self._snapshot: Callable[[], dict] | None = None  # the live state while iterating

    def _own_pending(self, stream: int) -> dict | None:
        return self._pending if self._pending is not None else self._by_stream.get(stream)

    def _resume(self, identity: dict, stream: int) -> dict | None:
        self._snapshot = None
        pending = self._own_pending(stream)
        if pending is None:
            return None
        check_same_identity(pending["identity"], identity)
        if pending.get("stream", stream) != stream:
            raise ValueError(f"data state of stream {pending['stream']} given to stream {stream}")
        return pending

    def _publish(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot

    def state_dict(self) -> dict:
        if self._snapshot:
            return {"pending": self._snapshot()}
        stream, _ = worker_stream(self.rank, self.world_size)
        return {"pending": self._own_pending(stream)}

    def load_state_dict(self, state: dict) -> None:
        self._pending, self._by_stream, self._snapshot = state["pending"], {}, None

    def load_streams(self, states: dict[int, dict | None]) -> None:
        """One state per stream of this rank (``{stream id: state}``), set before the loader
        starts its workers: each worker resumes from its own stream's (None: a fresh start)."""
        self._pending, self._by_stream, self._snapshot = None, dict(states), None
