"""A text source's streams re-partitioned over another layout (world size x workers).

The rule of ``data.repartition``, with items ``(fragment, first row, mod, rem)``: read the
fragment from that row, keeping rows with ``(fragment + row) % mod == rem``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from data.config import DataConfig
from data.partition import owns
from data.repartition import deal, merge_buffers, merge_stats, new_identity, switch_epoch
from data.text.files import TextSource, local_files
from data.text.stream import epoch_items, text_identity
from data.tokenizers import load_tokenizer


def repartition(
    config: DataConfig,
    old: list[dict | None],
    n_new: int,
    *,
    open_files: Callable[[DataConfig], TextSource] = local_files,
) -> list[dict | None]:
    """``DataSource.repartition`` of a text source whose files ``open_files`` opens."""
    if all(state is None for state in old):
        return [None] * n_new
    source = open_files(config)
    identity = new_identity(old, text_identity(config, source, n_new))
    if len(old) == n_new:
        return list(old)
    n_old, fragments = len(old), len(source.fragments)
    progress = [_progress(state) for state in old]
    switch = switch_epoch([(epoch, started) for _, epoch, started in progress])
    items = []
    for s, ((rest, epoch, started), state) in enumerate(zip(progress, old, strict=True)):
        parts = [rest]
        if started:  # the rest of its current epoch, from the exact row
            share_rows = epoch_items(config, fragments, epoch, s, n_old)[state["position"] :]
            first = np.zeros(len(share_rows), np.int64)
            first[:1] = state["row"]
            parts.append(np.column_stack([share_rows[:, 0], first, share_rows[:, 1:]]))
            epoch += 1
        for e in range(epoch, switch):
            share_rows = epoch_items(config, fragments, e, s, n_old)
            zeros = np.zeros(len(share_rows), np.int64)
            parts.append(np.column_stack([share_rows[:, 0], zeros, share_rows[:, 1:]]))
        items.append(np.concatenate([part.reshape(-1, 4) for part in parts]))
    dealt = deal(items, n_new)
    eos_id = load_tokenizer(config.tokenizer).eos_id
    buffers = merge_buffers([s["packer"]["buffer"] if s else None for s in old], n_new, eos_id)
    # a stream that never ran has not counted its unreadable files yet (a fresh start would)
    unread = [sum(owns(i, s, n_old) for i in source.unreadable) for s in range(n_old)]
    counts = [state["stats"] if state else {"bad_files": unread[s]} for s, state in enumerate(old)]
    stats = merge_stats(counts, n_new)
    return [
        {
            "identity": identity,
            "stream": t,
            "epoch": switch,
            "position": 0,
            "row": 0,
            "carry": torch.from_numpy(dealt[t]),
            "carry_done": 0,
            "carry_row": 0,
            "packer": {"buffer": buffers[t]},
            "stats": stats[t],
        }
        for t in range(n_new)
    ]


def _progress(state: dict | None) -> tuple[np.ndarray, int, bool]:
    """An old stream's unread carry-over items, its epoch, and whether it has read any of it."""
    if state is None:
        return np.zeros((0, 4), np.int64), 0, False
    rest = np.zeros((0, 4), np.int64)
    if "carry" in state:
        rest = state["carry"].numpy().reshape(-1, 4)[state["carry_done"] :].copy()
        if len(rest):
            rest[0, 1] = max(rest[0, 1], state["carry_row"])
    return rest, state["epoch"], (state["position"], state["row"]) != (0, 0)
