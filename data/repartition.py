"""Resume on another world size or number of DataLoader workers, losing and repeating nothing.

A checkpoint holds the state of each of the ``n_old = world_size x workers`` streams that wrote
it (stream ``rank * workers + worker``, ``data.partition``); a run with another layout has
``n_new`` streams. Every rank of the new run is given every old stream's state (the checkpoint
hands over every rank's data state; ``data.restore.restore_loader`` takes the streams' out of
them) and computes the same new states from them, so the ranks agree without talking. The rule:

1. **Switch epoch.** ``E`` = the largest, over the old streams, of their epoch, plus one when
   they have read anything of it (a stream that has read nothing of its epoch: a fresh one, or
   one still reading its own carry-over, has not started it). From epoch ``E`` on, the new
   streams read the new layout's shares, exactly as a run started with ``n_new`` streams.
2. **Carry-over.** What the old streams have not read of the epochs before ``E`` is listed in a
   fixed order: old stream 0's items, then old stream 1's, and so on; each old stream's are its
   own unread carry-over (left by an earlier change, in its order), then the rest of its share
   of its current epoch, from the exact row (text) or window (tokenized), then its whole share
   of every later epoch before ``E``. An item is, for text, a fragment read from a row, keeping
   only the old stream's rows when the old layout shared fragments by row
   (``(fragment + row) % n_old == stream``); for tokenized, one window. Item ``k`` of the list
   goes to new stream ``k % n_new``, which reads its items in that order before epoch ``E``.
3. **Packer buffers** (text; tokens tokenized but not yet emitted in a window). Old stream
   ``s``'s buffer goes to new stream ``s % n_new``; a new stream given several concatenates them
   in the order of ``s``, without the first token of each one after the first: consecutive
   windows overlap by one token, so a buffer's first token already was the last window's last
   target. A new stream given no buffer starts with one EOS, the token that ends every
   document: its carry-over starts at a document, and its first token is a target like every
   other (only a fresh stream's very first token is never predicted).
4. **Counters.** The sum of the old streams' counters goes to new stream 0 and nothing to the
   others, so the sum over ranks still counts every record once.

So every document (text) or window (tokenized) of every epoch is read exactly once over the
run, and every token is a target exactly once, except the first token of each stream of the
run's first layout, as in any run. A carry-over is itself a list of items, so changes compose
(2 ranks x 2 workers -> 1 x 1 -> 2 x 1, each before the last carry-over is done). When the
number of streams is unchanged (2 ranks x 1 worker -> 1 rank x 2 workers, or 0 <-> 1 workers),
old stream ``s``'s state is new stream ``s``'s, unchanged. The new states record the new
layout in their identity (``n_streams``); every other part of the identity (data, tokenizer,
sequence length, ...) must match the run's, as for any resume.

The sources that can be re-partitioned (``DataSource.repartition``) apply this rule; a source
whose position cannot be split exactly refuses (:class:`CannotRepartitionError`).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from data.resumable import check_same_identity


class CannotRepartitionError(ValueError):
    """The source's position cannot be split over another number of streams exactly."""


def new_identity(old: list[dict | None], current: dict) -> dict:
    """The new streams' identity (``current``: this run's, with the new ``n_streams``), once
    every old stream's identity is known to match it but for the layout (and ``old[s]`` to be
    stream ``s``'s state)."""
    for s, state in enumerate(old):
        if state is None:
            continue
        check_same_identity({**state["identity"], "n_streams": current["n_streams"]}, current)
        if state.get("stream", s) != s or state["identity"]["n_streams"] != len(old):
            raise ValueError(
                f"data state {s} of {len(old)} is stream {state.get('stream')} of "
                f"{state['identity']['n_streams']}: the checkpoint's data states are out of order"
            )
    return current


def switch_epoch(cursors: list[tuple[int, bool]]) -> int:
    """``E`` of rule 1, from each old stream's (epoch, whether it has read anything of it)."""
    return max((epoch + started for epoch, started in cursors), default=0)


def deal(items_per_stream: list[np.ndarray], n_new: int) -> list[np.ndarray]:
    """Rule 2: the old streams' items (one row each) in order, item ``k`` to new stream
    ``k % n_new``."""
    items = np.concatenate(items_per_stream)
    return [items[stream::n_new].copy() for stream in range(n_new)]


def merge_buffers(
    buffers: list[torch.Tensor | None], n_new: int, eos_id: int
) -> list[torch.Tensor]:
    """Rule 3: old stream ``s``'s packer buffer (None: empty) to new stream ``s % n_new``."""
    merged: list[list[torch.Tensor]] = [[] for _ in range(n_new)]
    for s, buffer in enumerate(buffers):
        if buffer is None or len(buffer) == 0:
            continue
        parts = merged[s % n_new]
        parts.append(buffer[1:] if parts else buffer)
    lead = torch.tensor([eos_id], dtype=torch.long)
    return [torch.cat(parts).long() if parts else lead.clone() for parts in merged]


def merge_stats(stats: list[dict], n_new: int) -> list[dict]:
    """Rule 4: every old counter summed into new stream 0."""
    total: Counter = Counter()
    for counts in stats:
        total.update({key: int(value) for key, value in counts.items()})
    return [dict(total)] + [{} for _ in range(n_new - 1)]
