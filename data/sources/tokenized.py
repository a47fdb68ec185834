"""``tokenized``: binary token shards written by ``scripts/pretokenize.py`` (``data.shards``).

Windows of ``seq_len + 1`` tokens start every ``seq_len`` tokens after the validation slice
(the first ``validation_documents`` documents, found by counting EOS: the same documents the
text source they were written from holds out); window ``i`` of the epoch's order belongs to
stream ``i % n`` (``data.sharding``), and the order is a seeded permutation per epoch when
shuffling. State: epoch and the number of windows this stream has yielded.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from data.config import DataConfig
from data.packing import Packer, pack
from data.registry import DataSource, register
from data.resume import ResumableStream
from data.sharding import share, worker_stream
from data.shards import TokenCorpus


class TokenStream(ResumableStream):
    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        super().__init__()
        self.config, self.rank, self.world_size = config, rank, world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        c = self.config
        corpus = TokenCorpus(c)
        stream, n = worker_stream(self.rank, self.world_size)
        identity = {
            "source": corpus.fingerprint,
            "seq_len": c.seq_len,
            "n_streams": n,
            "validation_documents": c.validation_documents,
            "seed": c.seed,
            "shuffle": c.shuffle,
        }
        windows = (corpus.total - corpus.validation_end - 1) // c.seq_len
        if windows < n:
            raise ValueError(f"{windows} training windows cannot feed {n} streams: too little data")
        epoch, done, stats = 0, 0, {"windows": 0, "tokens": 0}
        if (state := self._resume(identity)) is not None:
            epoch, done = state["epoch"], state["done"]
            stats = dict(state.get("stats", stats))
        live: dict = {}  # empty until the first window: state_dict() is then what was loaded
        self._publish(
            lambda: {"identity": identity, **live, "stats": dict(stats)} if live else state
        )
        packer = Packer(c.seq_len, corpus.eos_id, c.document_mask)
        while True:
            if c.shuffle:
                gen = torch.Generator().manual_seed(c.seed * 1_000_003 + epoch)
                order = share(torch.randperm(windows, generator=gen), stream, n).numpy()
            else:
                order = share(np.arange(windows), stream, n)
            for k in range(done, len(order)):
                begin = corpus.validation_end + int(order[k]) * c.seq_len
                live.update(epoch=epoch, done=k + 1)
                stats["windows"] += 1
                stats["tokens"] += c.seq_len
                yield packer.window(corpus.slice(begin, begin + c.seq_len + 1))
            epoch, done = epoch + 1, 0


def validation_windows(config: DataConfig) -> Iterator[dict[str, torch.Tensor]]:
    """The held-out documents' tokens as windows (``DataSource.validation``)."""
    corpus = TokenCorpus(config)
    packer = Packer(config.seq_len, corpus.eos_id, config.document_mask)
    yield from pack([corpus.slice(0, corpus.validation_end)], packer)


register(
    DataSource(
        name="tokenized",
        summary="binary token shards from scripts/pretokenize.py (memory-mapped)",
        training=TokenStream,
        validation=validation_windows,
        needs_paths=True,
    )
)
