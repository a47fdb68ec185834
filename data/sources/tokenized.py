"""``tokenized``: binary token shards written by ``scripts/pretokenize.py`` (``data.shards``).

Windows of ``seq_len + 1`` tokens start every ``seq_len`` tokens after the validation slice
(the first ``validation_documents`` documents, found by counting EOS: the same documents the
text source they were written from holds out); window ``i`` of the epoch's order belongs to
stream ``i % n`` (``data.partition``), and the order is a seeded permutation per epoch when
shuffling. State: epoch and the number of windows this stream has yielded; after a resume on
another world size or number of workers (``repartition``, by the rule of ``data.repartition``)
also the windows left over from the old layout that this stream reads first (``carry``) and how
many of them it has read (``carry_done``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from data.config import DataConfig
from data.packing import Packer
from data.partition import share, worker_stream
from data.repartition import deal, merge_stats, new_identity, switch_epoch
from data.resumable import ResumableStream
from data.shards import TokenCorpus, check_tokenizer
from data.source import DataError, DataSource
from data.validation import held_out_windows


def token_identity(config: DataConfig, corpus: TokenCorpus, n_streams: int) -> dict:
    """What a saved state must match to resume (``data.resumable``)."""
    return {
        "files": corpus.listing,  # before the fingerprint: a refusal names the file
        "source": corpus.fingerprint,
        "seq_len": config.seq_len,
        "n_streams": n_streams,
        "validation_documents": config.validation_documents,
        "seed": config.seed,
        "shuffle": config.shuffle,
    }


def training_windows(config: DataConfig, corpus: TokenCorpus) -> int:
    """Windows per epoch: ``seq_len + 1`` tokens every ``seq_len`` after the validation slice."""
    return (corpus.total - corpus.validation_end - 1) // config.seq_len


def epoch_order(config: DataConfig, windows: int, epoch: int) -> np.ndarray:
    """Every window of epoch ``epoch`` in the order the streams share them (``data.partition``)."""
    if config.shuffle:
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
        return torch.randperm(windows, generator=gen).numpy()
    return np.arange(windows)


NO_WINDOWS = torch.zeros(0, dtype=torch.long)


class TokenStream(ResumableStream):
    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(rank, world_size)
        self.config = config

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        c = self.config
        corpus = TokenCorpus(c)
        stream, n = worker_stream(self.rank, self.world_size)
        identity = token_identity(c, corpus, n)
        windows = training_windows(c, corpus)
        if windows < n:
            raise DataError(
                f"data.paths: {windows} training windows after the held-out documents cannot "
                f"feed {n} streams (world size x data.num_workers): too little data"
            )
        epoch, done, stats = 0, 0, {"windows": 0, "tokens": 0}
        carry, carry_done = NO_WINDOWS, 0
        if (state := self._resume(identity, stream)) is not None:
            epoch, done = state["epoch"], state["done"]
            stats.update(state.get("stats", {}))
            if "carry" in state:  # left by a resume on another layout (data.repartition)
                carry, carry_done = state["carry"], state["carry_done"]
        live: dict = {}  # empty until the first window: state_dict() is then what was loaded
        self._publish(
            lambda: (
                {"identity": identity, "stream": stream, **live, "stats": dict(stats)}
                if live
                else state
            )
        )
        packer = Packer(c.seq_len, corpus.eos_id, c.document_mask)

        def window(index: int) -> dict[str, torch.Tensor]:
            begin = corpus.validation_end + int(index) * c.seq_len
            stats["windows"] += 1
            stats["tokens"] += c.seq_len
            return packer.window(corpus.slice(begin, begin + c.seq_len + 1))

        for k in range(carry_done, len(carry)):
            live.update(epoch=epoch, done=0, carry=carry, carry_done=k + 1)
            yield window(carry[k])
        live.pop("carry", None)
        live.pop("carry_done", None)
        while True:
            order = share(epoch_order(c, windows, epoch), stream, n)
            for k in range(done, len(order)):
                live.update(epoch=epoch, done=k + 1)
                yield window(order[k])
            epoch, done = epoch + 1, 0


def repartition(config: DataConfig, old: list[dict | None], n_new: int) -> list[dict | None]:
    """``DataSource.repartition`` of the tokenized source: the rule of ``data.repartition``,
    with items the window indices (window ``i`` starts ``i * seq_len`` tokens after the
    validation slice); there is no packer buffer (windows are cut straight from the shards)."""
    if all(state is None for state in old):
        return [None] * n_new
    corpus = TokenCorpus(config)
    identity = new_identity(old, token_identity(config, corpus, n_new))
    if len(old) == n_new:
        return list(old)
    n_old, windows = len(old), training_windows(config, corpus)
    orders: dict[int, np.ndarray] = {}  # one permutation per epoch, shared by the old streams

    def old_share(epoch: int, s: int) -> np.ndarray:
        if epoch not in orders:
            orders[epoch] = epoch_order(config, windows, epoch)
        return share(orders[epoch], s, n_old)

    progress = []  # (unread carry-over, epoch, read anything of it)
    for state in old:
        if state is None:
            progress.append((np.zeros(0, np.int64), 0, False))
            continue
        rest = state.get("carry", NO_WINDOWS).numpy()[state.get("carry_done", 0) :]
        progress.append((rest, state["epoch"], state["done"] > 0))
    switch = switch_epoch([(epoch, started) for _, epoch, started in progress])
    items = []
    for s, ((rest, epoch, started), state) in enumerate(zip(progress, old, strict=True)):
        parts = [rest]
        if started:  # the rest of its current epoch, from the exact window
            parts.append(old_share(epoch, s)[state["done"] :])
            epoch += 1
        parts.extend(old_share(e, s) for e in range(epoch, switch))
        items.append(np.concatenate(parts).astype(np.int64))
    dealt = deal(items, n_new)
    stats = merge_stats([state.get("stats", {}) for state in old if state], n_new)
    return [
        {
            "identity": identity,
            "stream": t,
            "epoch": switch,
            "done": 0,
            "carry": torch.from_numpy(dealt[t]),
            "carry_done": 0,
            "stats": stats[t],
        }
        for t in range(n_new)
    ]


def validation_windows(config: DataConfig) -> Iterator[dict[str, torch.Tensor]]:
    """The held-out documents: the tokens before the validation boundary, as one stretch."""
    corpus = TokenCorpus(config)
    yield from held_out_windows(config, [corpus.slice(0, corpus.validation_end)], corpus.eos_id)


SOURCE = DataSource(
    name="tokenized",
    summary="binary token shards from scripts/pretokenize.py (memory-mapped)",
    training=TokenStream,
    validation=validation_windows,
    needs_paths=True,
    path_suffixes=(".bin",),
    check=TokenCorpus,
    check_tokenizer=check_tokenizer,
    repartition=repartition,
)
