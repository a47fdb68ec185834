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
token buffer, the counters, and a fingerprint of the source, stream layout and tokenizer, so a
resume on different data is refused instead of silently misaligned. A resume on another world
size or number of workers re-partitions the streams' positions (``repartition`` below, by the
rule of ``data.repartition``): a new stream first reads its *carry-over*, the items it was
dealt (``carry``, ``carry_done``, ``carry_row``: which are read and the next row of the
current one), then the new layout's epochs.
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
from data.packing import Packer, pack, pack_document
from data.registry import get_source
from data.repartition import deal, merge_buffers, merge_stats, new_identity, switch_epoch
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


def text_identity(config: DataConfig, source: TextSource, n_streams: int) -> dict:
    """What a saved state must match to resume (``data.resume``)."""
    return {
        "source": source.fingerprint,
        "tokenizer": config.tokenizer.name,
        "seq_len": config.seq_len,
        "n_streams": n_streams,
        "validation_documents": config.validation_documents,
        "shuffle": config.shuffle,
        "seed": config.seed,
    }


def epoch_items(config: DataConfig, fragments: int, epoch: int, stream: int, n: int) -> np.ndarray:
    """Stream ``stream``'s share of epoch ``epoch``, in order, as rows ``(fragment, mod, rem)``:
    it reads the rows of the fragment with ``(fragment + row) % mod == rem`` (``mod`` 1: all)."""
    order = list(range(fragments))
    if config.shuffle:
        random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
    if fragments >= n:  # by fragment
        rows = [(index, 1, 0) for index in share(order, stream, n)]
    else:  # by row
        rows = [(index, n, stream) for index in order]
    return np.array(rows, np.int64).reshape(-1, 3)


class TextStream(ResumableStream):
    """Endless training windows ``{"inputs", "targets"[, "document_ids"]}`` of one stream."""

    def __init__(
        self, config: DataConfig, rank: int = 0, world_size: int = 1, epochs: int | None = None
    ) -> None:
        """``epochs=None`` (training) never ends; a number ends after it, flushing the packer."""
        super().__init__(rank, world_size)
        self.config, self.epochs = config, epochs
        self._cursor: dict = {}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        c = self.config
        source = open_text(c)
        tokenizer = load_tokenizer(c.tokenizer)
        stream, n = worker_stream(self.rank, self.world_size)
        identity = text_identity(c, source, n)
        held_fragment, held_row = held_out_end(source, c.validation_documents)
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_mask)
        stats: Counter = Counter()
        cursor = {"epoch": 0, "position": 0, "row": 0}
        carry = NO_ITEMS
        if (state := self._resume(identity, stream)) is not None:
            if state["stream"] != stream:
                raise ValueError(f"data state of stream {state['stream']} given to stream {stream}")
            packer.load_state_dict(state["packer"])
            stats.update(state["stats"])
            cursor = {key: state[key] for key in ("epoch", "position", "row")}
            if "carry" in state:  # left by a resume on another layout (data.repartition)
                carry = state["carry"]
                cursor.update(carry_done=state["carry_done"], carry_row=state["carry_row"])
        else:  # an unreadable file has no rows: one stream counts it, once per run
            if bad_files := sum(owns(i, stream, n) for i in source.unreadable):
                stats["bad_files"] += bad_files
        self._cursor = cursor
        self._publish(lambda: self._state(identity, stream, carry, packer, stats))
        fragments = source.fragments
        if not fragments:
            raise RuntimeError("the data source has no readable fragments (see warnings above)")

        def read(index: int, start: int, mod: int, rem: int, where: dict, key: str):
            """Fragment ``index`` from row ``start``, its rows ``(index + row) % mod == rem``."""
            if index < held_fragment:  # wholly held out
                return
            if index == held_fragment:
                start = max(start, held_row)
            for r, text, skipped in source.records(fragments[index], start):
                if not owns(index + r, rem, mod):
                    continue
                # state_dict() runs while we are suspended below: the next record to read is
                # r + 1 and every window not yet yielded is still in the packer's buffer
                self._cursor = {**where, key: r + 1}
                if text is None:
                    stats[skipped] += 1
                    continue
                yield from pack_document(packer, tokenizer, text, c.tokenizer.add_bos, stats)

        epoch = cursor["epoch"]
        row = cursor.get("carry_row", 0)
        for k in range(cursor.get("carry_done", len(carry)), len(carry)):
            index, first, mod, rem = carry[k].tolist()
            where = {"epoch": epoch, "position": 0, "row": 0, "carry_done": k}
            yield from read(index, max(first, row), mod, rem, where, "carry_row")
            row = 0
        position, row = cursor["position"], cursor["row"]
        while self.epochs is None or epoch < self.epochs:
            items = epoch_items(c, len(fragments), epoch, stream, n)
            for p in range(position, len(items)):
                index, mod, rem = items[p].tolist()
                start = row if p == position else 0
                yield from read(index, start, mod, rem, {"epoch": epoch, "position": p}, "row")
            if stats["documents"] == 0:
                raise RuntimeError(
                    "a whole epoch yielded no training document for this stream: the source is "
                    f"empty after holding out {c.validation_documents} validation documents "
                    f"(counters: {dict(stats)})"
                )
            epoch, position, row = epoch + 1, 0, 0
        yield from packer.flush()

    def _state(
        self, identity: dict, stream: int, carry: torch.Tensor, packer: Packer, stats: Counter
    ) -> dict:
        state = {
            "identity": identity,
            "stream": stream,
            **self._cursor,
            "packer": packer.state_dict(),
            "stats": dict(stats),
        }
        if "carry_done" in state:  # still reading the carry-over
            state["carry"] = carry
        return state


NO_ITEMS = torch.zeros((0, 4), dtype=torch.long)


def repartition(config: DataConfig, old: list[dict | None], n_new: int) -> list[dict | None]:
    """``DataSource.repartition`` of the text sources: the rule of ``data.repartition``, with
    items ``(fragment, first row, mod, rem)``: read the fragment from that row, keeping rows
    with ``(fragment + row) % mod == rem``."""
    if all(state is None for state in old):
        return [None] * n_new
    source = open_text(config)
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
