"""The training windows of one text stream (one rank-and-worker's share of the documents).

How the documents are shared, held out and resumed: ``data.text``.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import torch

from data.config import DataConfig
from data.packing import Packer, pack_document
from data.partition import owns, share, worker_stream
from data.resumable import ResumableStream
from data.source import DataError
from data.text.files import TextSource, local_files
from data.tokenizers import load_tokenizer


def held_out_end(source: TextSource, documents: int) -> tuple[int, int]:
    """(fragment, row) just past the first ``documents`` documents: the fragments before that
    fragment, and its rows before that row, are held out."""
    if documents == 0:
        return 0, 0
    for index, row, _ in itertools.islice(source.documents(), documents - 1, None):
        return index, row + 1
    return len(source.fragments), 0  # fewer documents than that: everything is held out


def no_training_document(source: TextSource, config: DataConfig) -> DataError:
    """The refusal of a stream that a whole epoch gave no document: what the files hold, every
    record counted (the held-out ones too, which the stream's own counters leave out)."""
    found: Counter = Counter()
    for fragment in source.fragments:
        for _, text, skipped in source.records(fragment):
            found["documents" if text is not None else skipped] += 1
    return DataError(
        f"no training document for this stream in a whole epoch: the files data.paths names "
        f"hold {found['documents']} documents and data.validation_documents="
        f"{config.validation_documents} are held out (their records: {dict(found)}). Give it "
        "more documents, or hold out fewer"
    )


def text_identity(config: DataConfig, source: TextSource, n_streams: int) -> dict:
    """What a saved state must match to resume (``data.resumable``)."""
    return {
        "files": source.listing,  # before the fingerprint: a refusal names the file
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
        self,
        config: DataConfig,
        rank: int = 0,
        world_size: int = 1,
        epochs: int | None = None,
        *,
        open_files: Callable[[DataConfig], TextSource] = local_files,
    ) -> None:
        """``epochs=None`` (training) never ends; a number ends after it, flushing the packer.
        ``open_files``: the source's files (``data.text.text_file_source``)."""
        super().__init__(rank, world_size)
        self.config, self.epochs, self.open_files = config, epochs, open_files
        self._cursor: dict = {}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        c = self.config
        source = self.open_files(c)
        tokenizer = load_tokenizer(c.tokenizer)
        stream, n = worker_stream(self.rank, self.world_size)
        identity = text_identity(c, source, n)
        held_fragment, held_row = held_out_end(source, c.validation_documents)
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_mask)
        stats: Counter = Counter()
        cursor = {"epoch": 0, "position": 0, "row": 0}
        carry = NO_ITEMS
        if (state := self._resume(identity, stream)) is not None:
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
            raise DataError("data.paths: none of its files can be read (see the warnings above)")

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
                raise no_training_document(source, c)
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
