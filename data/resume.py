"""Exact resume for every training stream: a loaded state waits until iteration starts.

``StatefulDataLoader`` calls ``load_state_dict`` before the stream's ``__iter__`` runs (in the
worker process, when there are workers), and ``state_dict`` while the stream is suspended at a
``yield``. So a loaded state is kept *pending* and applied when iteration starts; from then on
``state_dict`` reads the *live* position the stream publishes. Both are wrapped as
``{"pending": state}``, so saving a stream that never ran returns what was loaded, unchanged.

A state carries the stream's identity (a fingerprint of the data, tokenizer, sequence length and
stream layout); a resume whose identity differs is refused instead of silently misaligned.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import IterableDataset


def check_same_identity(saved: dict, current: dict) -> None:
    """Refuse a resume whose data, tokenizer, layout or world size differ from the checkpoint's."""
    for key, value in current.items():
        if saved.get(key) != value:
            raise ValueError(
                f"cannot resume the data pipeline: its {key} was {saved.get(key)!r} when the "
                f"checkpoint was written and is {value!r} now (a different dataset, "
                "tokenizer, sequence length or world size x workers); start a new run "
                "or restore the original setting"
            )


class ResumableStream(IterableDataset):
    """Base of the training streams: ``state_dict`` / ``load_state_dict`` and their timing.

    In ``__iter__`` a stream calls ``_resume(identity)`` first (the checked saved state, or
    None for a fresh start) and then ``_publish(snapshot)`` with a function returning its
    current state, which must include ``"identity"`` and may include ``"stats"`` (its counters,
    read by ``data.counters``).
    """

    def __init__(self) -> None:
        self._pending: dict | None = None  # a loaded state, applied when iteration starts
        self._snapshot: Callable[[], dict] | None = None  # the live state while iterating

    def _resume(self, identity: dict) -> dict | None:
        self._snapshot = None
        if self._pending is None:
            return None
        check_same_identity(self._pending["identity"], identity)
        return self._pending

    def _publish(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot

    def state_dict(self) -> dict:
        return {"pending": self._snapshot() if self._snapshot else self._pending}

    def load_state_dict(self, state: dict) -> None:
        self._pending, self._snapshot = state["pending"], None
