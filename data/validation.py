"""The held-out slice: the first ``validation_documents`` documents of the source, as windows.

The same documents for every run, activation and world size, so perplexities are comparable.
A source's ``validation`` only says which documents are held out; how they become windows is
written once here, so that no two sources cut their slices differently: packed like training
windows, with the last, partial window padded with ignored targets (``IGNORE_INDEX``), so that
evaluation reaches the slice's last token. The loaders that share the slice out to the ranks:
``data.loader``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from data.config import DataConfig
from data.packing import Packer, pack
from data.tokenizers import encode_document, load_tokenizer


def held_out_windows(
    config: DataConfig, documents: Iterable[np.ndarray], eos_id: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Every window of the held-out documents' tokens (each ``[BOS] ids EOS``), in order."""
    yield from pack(documents, Packer(config.seq_len, eos_id, config.document_mask))


def held_out_text_windows(
    config: DataConfig, texts: Iterable[str]
) -> Iterator[dict[str, torch.Tensor]]:
    """:func:`held_out_windows` of documents given as text, encoded as training encodes them."""
    tokenizer = load_tokenizer(config.tokenizer)
    ids = (encode_document(tokenizer, text, config.tokenizer.add_bos) for text in texts)
    yield from held_out_windows(config, ids, tokenizer.eos_id)
