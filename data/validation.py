"""The held-out validation slice: the first ``validation_documents`` records of the source.

The same documents for every run, activation and world size. Every rank packs the whole slice
the same way and keeps windows ``i % world_size == rank`` (the last, partial window padded with
ignored targets), so the windows, and the token-weighted loss over them, do not depend on the
world size.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

from data.config import DataConfig
from data.packing import Packer
from data.stream import held_out_rows, text_source
from data.tokenizers import document_ids, load_tokenizer


class ValidationStream(IterableDataset):
    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        c = self.config
        if c.source == "tokenized":
            from data.shards import validation_windows

            yield from validation_windows(c, self.rank, self.world_size)
            return
        if c.source == "fineweb_edu":
            from data.hub import hub_documents

            documents = hub_documents(c, validation=True)
        else:
            documents = self._local_documents()
        tokenizer = load_tokenizer(c.tokenizer)
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_ids)
        index = 0
        for text in documents:
            if text is None:
                continue
            packer.add(document_ids(tokenizer, text, c.tokenizer.add_bos))
            while (window := packer.pop()) is not None:
                if index % self.world_size == self.rank:
                    yield window
                index += 1
        if index % self.world_size == self.rank:
            yield from packer.flush()

    def _local_documents(self) -> Iterator[str | None]:
        source = text_source(self.config)
        for index, rows in held_out_rows(source, self.config.validation_documents).items():
            for r, text in source.read(source.fragments[index]):
                if r >= rows:
                    break
                yield text
