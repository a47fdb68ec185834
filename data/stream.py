"""One rank-and-worker's share of a text source, tokenized and packed, resumable exactly.

Sharding: the ``n = world_size * workers`` streams partition the documents. With at least ``n``
fragments, stream ``s`` reads fragments ``s, s + n, ...`` of the epoch's order (no stream opens
another's files); with fewer, every stream opens every fragment and keeps rows with
``(fragment + row) % n == s``. Either way each document goes to exactly one stream.

State is a handful of integers (epoch, fragment position, next row), the packer's token
buffer, the counters, and a fingerprint of the source, world size and tokenizer, so a resume on
different data or a different world size is refused instead of silently misaligned.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from data.builtin_corpus import builtin_corpus_path
from data.config import DataConfig
from data.packing import Packer
from data.sources import TextSource
from data.tokenizers import document_ids, load_tokenizer


def text_source(config: DataConfig) -> TextSource:
    if config.source == "builtin":
        return TextSource([str(builtin_corpus_path(config.cache_dir))])
    return TextSource(config.paths, config.text_column, config.min_int_score)


def held_out_rows(source: TextSource, documents: int) -> dict[int, int]:
    """Rows per fragment (in file order) that belong to the validation slice."""
    held, left = {}, documents
    for index, fragment in enumerate(source.fragments):
        if left <= 0:
            break
        held[index] = min(left, source.count_rows(fragment))
        left -= held[index]
    return held


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


def worker_split(world_size: int, rank: int) -> tuple[int, int]:
    """(stream id, number of streams) of the calling DataLoader worker."""
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info else (1, 0)
    return rank * workers + worker, world_size * workers


class TextStream(IterableDataset):
    """Endless training windows ``{"inputs", "targets"[, "document_ids"]}`` of one stream."""

    def __init__(
        self, config: DataConfig, rank: int = 0, world_size: int = 1, epochs: int | None = None
    ) -> None:
        """``epochs=None`` (training) never ends; a number ends after it, flushing the packer."""
        self.config, self.rank, self.world_size, self.epochs = config, rank, world_size, epochs
        self._pending: dict | None = None  # a loaded state, applied when iteration starts
        self._live: tuple | None = None  # what state_dict() reads while iterating
        self._cursor = (0, 0, 0)

    def _fingerprint(self, source: TextSource, n_streams: int) -> dict:
        c = self.config
        return {
            "source": source.fingerprint,
            "tokenizer": c.tokenizer.name,
            "seq_len": c.seq_len,
            "n_streams": n_streams,
            "validation_documents": c.validation_documents,
            "shuffle": c.shuffle,
            "seed": c.seed,
        }

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        c = self.config
        source = text_source(c)
        tokenizer = load_tokenizer(c.tokenizer)
        stream, n = worker_split(self.world_size, self.rank)
        identity = self._fingerprint(source, n)
        held = held_out_rows(source, c.validation_documents)
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_ids)
        epoch, position, row = 0, 0, 0
        if self._pending is not None:
            epoch, position, row = self._restore(self._pending, identity, stream, packer, source)
        self._live = (identity, stream, packer, source)
        self._cursor = (epoch, position, row)
        fragments = source.fragments
        if not fragments:
            raise RuntimeError("the data source has no readable fragments (see warnings above)")
        by_fragment = len(fragments) >= n
        while True:
            order = list(range(len(fragments)))
            if c.shuffle:
                random.Random(c.seed * 1_000_003 + epoch).shuffle(order)
            mine = order[stream::n] if by_fragment else order
            while position < len(mine):
                index = mine[position]
                for r, text in source.read(fragments[index], row):
                    if r < held.get(index, 0) or text is None:
                        continue
                    if not by_fragment and (index + r) % n != stream:
                        continue
                    ids = document_ids(tokenizer, text, c.tokenizer.add_bos)
                    source.stats["documents"] += 1
                    source.stats["tokens"] += len(ids)
                    packer.add(ids)
                    # state_dict() runs while we are suspended below: the next document to read
                    # is r + 1 and every window not yet yielded is still in the packer's buffer
                    self._cursor = (epoch, position, r + 1)
                    while (window := packer.pop()) is not None:
                        yield window
                position, row = position + 1, 0
            if source.stats["documents"] == 0:
                raise RuntimeError(
                    "a whole epoch yielded no training document for this stream: the source is "
                    f"empty after holding out {c.validation_documents} validation documents "
                    f"(counters: {dict(source.stats)})"
                )
            epoch, position = epoch + 1, 0
            if self.epochs is not None and epoch >= self.epochs:
                yield from packer.flush()
                return

    def _restore(self, state, identity, stream, packer, source) -> tuple[int, int, int]:
        check_same_identity(state["identity"], identity)
        if state["stream"] != stream:
            raise ValueError(f"data state of stream {state['stream']} given to stream {stream}")
        packer.load_state_dict(state["packer"])
        source.stats.update(Counter(state["stats"]))
        return state["epoch"], state["position"], state["row"]

    def state_dict(self) -> dict:
        if self._live is None:
            return {"pending": self._pending}
        identity, stream, packer, source = self._live
        epoch, position, row = self._cursor
        return {
            "pending": {
                "identity": identity,
                "stream": stream,
                "epoch": epoch,
                "position": position,
                "row": row,
                "packer": packer.state_dict(),
                "stats": dict(source.stats),
            }
        }

    def load_state_dict(self, state: dict) -> None:
        self._pending = state["pending"]
        self._live = None
