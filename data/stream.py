"""The text-file sources (``builtin``, ``local``): training windows of one rank-and-worker's
stream, the held-out validation windows, and every document for ``scripts/pretokenize.py``.

Held out: the first ``validation_documents`` documents in the global (file) order. Skipped
records (bad, empty, filtered by ``min_int_score``) among them do not count, so the slice holds
exactly that many documents, like the tokenized source, which counts EOS tokens.

Sharding (``data.sharding``): the ``n = world_size * workers`` streams partition the documents.
With at least ``n`` fragments, stream ``s`` reads fragments ``s, s + n, ...`` of the epoch's
order (no stream opens another's files); with fewer, every stream opens every fragment and keeps
rows with ``(fragment + row) % n == s``. Either way each document goes to exactly one stream, and
each skipped record is counted exactly once: by the stream that owns its row, and only outside
the held-out slice (training never reads that slice; the validation pass counts nothing).

State (``data.resume``): a handful of integers (epoch, fragment position, next row), the packer's
token buffer, the counters, and a fingerprint of the source, world size and tokenizer, so a
resume on different data or a different world size is refused instead of silently misaligned.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator
from multiprocessing import get_context

import numpy as np
import torch

from data.config import DataConfig
from data.packing import Packer, pack
from data.registry import get_source
from data.resume import ResumableStream
from data.sharding import owns, share, worker_stream
from data.text_files import TextSource
from data.tokenizers import encode_document, load_tokenizer


def open_text(config: DataConfig) -> TextSource:
    """The files of a text source, as its registered ``open_text`` opens them."""
    opener = get_source(config.source).open_text
    if opener is None:
        raise ValueError(f"data.source={config.source} is not read from text files")
    return opener(config)


def held_out_end(source: TextSource, documents: int) -> tuple[int, int]:
    """(fragment, row) just past the first ``documents`` documents: the fragments before that
    fragment, and its rows before that row, are held out."""
    if documents == 0:
        return 0, 0
    for index, row, _ in itertools.islice(source.documents(), documents - 1, None):
        return index, row + 1
    return len(source.fragments), 0  # fewer documents than that: everything is held out


class TextStream(ResumableStream):
    """Endless training windows ``{"inputs", "targets"[, "document_ids"]}`` of one stream."""

    def __init__(
        self, config: DataConfig, rank: int = 0, world_size: int = 1, epochs: int | None = None
    ) -> None:
        """``epochs=None`` (training) never ends; a number ends after it, flushing the packer."""
        super().__init__()
        self.config, self.rank, self.world_size, self.epochs = config, rank, world_size, epochs
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
        source = open_text(c)
        tokenizer = load_tokenizer(c.tokenizer)
        stream, n = worker_stream(self.rank, self.world_size)
        identity = self._fingerprint(source, n)
        held_fragment, held_row = held_out_end(source, c.validation_documents)
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_mask)
        stats: Counter = Counter()
        epoch, position, row = 0, 0, 0
        if (state := self._resume(identity)) is not None:
            if state["stream"] != stream:
                raise ValueError(f"data state of stream {state['stream']} given to stream {stream}")
            packer.load_state_dict(state["packer"])
            stats.update(state["stats"])
            epoch, position, row = state["epoch"], state["position"], state["row"]
        else:  # an unreadable file has no rows: one stream counts it, once per run
            if bad_files := sum(owns(i, stream, n) for i in source.unreadable):
                stats["bad_files"] += bad_files
        self._cursor = (epoch, position, row)
        self._publish(lambda: self._state(identity, stream, packer, stats))
        fragments = source.fragments
        if not fragments:
            raise RuntimeError("the data source has no readable fragments (see warnings above)")
        by_fragment = len(fragments) >= n
        while True:
            order = list(range(len(fragments)))
            if c.shuffle:
                random.Random(c.seed * 1_000_003 + epoch).shuffle(order)
            mine = share(order, stream, n) if by_fragment else order
            while position < len(mine):
                index = mine[position]
                if index < held_fragment:  # wholly held out
                    position, row = position + 1, 0
                    continue
                start = max(row, held_row) if index == held_fragment else row
                for r, text, skipped in source.records(fragments[index], start):
                    if not by_fragment and not owns(index + r, stream, n):
                        continue
                    if text is None:
                        stats[skipped] += 1
                        continue
                    ids = encode_document(tokenizer, text, c.tokenizer.add_bos)
                    stats["documents"] += 1
                    stats["tokens"] += len(ids)
                    packer.add(ids)
                    # state_dict() runs while we are suspended below: the next document to read
                    # is r + 1 and every window not yet yielded is still in the packer's buffer
                    self._cursor = (epoch, position, r + 1)
                    while (window := packer.pop()) is not None:
                        yield window
                position, row = position + 1, 0
            if stats["documents"] == 0:
                raise RuntimeError(
                    "a whole epoch yielded no training document for this stream: the source is "
                    f"empty after holding out {c.validation_documents} validation documents "
                    f"(counters: {dict(stats)})"
                )
            epoch, position = epoch + 1, 0
            if self.epochs is not None and epoch >= self.epochs:
                yield from packer.flush()
                return

    def _state(self, identity: dict, stream: int, packer: Packer, stats: Counter) -> dict:
        epoch, position, row = self._cursor
        return {
            "identity": identity,
            "stream": stream,
            "epoch": epoch,
            "position": position,
            "row": row,
            "packer": packer.state_dict(),
            "stats": dict(stats),
        }


def validation_windows(config: DataConfig) -> Iterator[dict[str, torch.Tensor]]:
    """The held-out documents' windows (``DataSource.validation`` of the text sources)."""
    source = open_text(config)
    tokenizer = load_tokenizer(config.tokenizer)
    held = itertools.islice(source.documents(), config.validation_documents)
    ids = (encode_document(tokenizer, text, config.tokenizer.add_bos) for _, _, text in held)
    yield from pack(ids, Packer(config.seq_len, tokenizer.eos_id, config.document_mask))


_worker: dict = {}


def _open_worker(config: DataConfig) -> None:
    _worker.update(
        config=config, source=open_text(config), tokenizer=load_tokenizer(config.tokenizer)
    )


def _tokenize_fragment(index: int) -> tuple[np.ndarray, Counter]:
    source, tokenizer = _worker["source"], _worker["tokenizer"]
    add_bos = _worker["config"].tokenizer.add_bos
    docs, stats = [np.zeros(0, dtype=np.int64)], Counter()
    for _, text, skipped in source.records(source.fragments[index]):
        if text is None:
            stats[skipped] += 1
            continue
        docs.append(encode_document(tokenizer, text, add_bos))
        stats["documents"] += 1
    return np.concatenate(docs), stats


def pretokenize_chunks(config: DataConfig, workers: int) -> Iterator[tuple[np.ndarray, Counter]]:
    """Every document, one chunk per fragment, tokenized in ``workers`` processes (in order)."""
    source = open_text(config)
    if source.unreadable:
        yield np.zeros(0, dtype=np.int64), Counter(bad_files=len(source.unreadable))
    n = len(source.fragments)
    if workers <= 1:
        _open_worker(config)
        yield from map(_tokenize_fragment, range(n))
        return
    with get_context("spawn").Pool(workers, initializer=_open_worker, initargs=(config,)) as pool:
        yield from pool.imap(_tokenize_fragment, range(n))
