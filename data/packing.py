"""Concatenate documents and cut them into ``seq_len + 1`` windows.

Consecutive windows overlap by one token (window k covers tokens [k*L, k*L + L]), so every
token after the first is a target exactly once. The packer's whole state is its buffer of
not-yet-emitted tokens, which goes into the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping

import numpy as np
import torch

from data.tokenizers import Tokenizer, encode_document

# targets the loss skips: torch's cross-entropy default, which model.loss defaults to as well
IGNORE_INDEX = -100


class Packer:
    """``document_mask``: windows also carry ``"document_ids"`` (see ``document_index``)."""

    def __init__(self, seq_len: int, eos_id: int, document_mask: bool = False) -> None:
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.document_mask = document_mask
        self.buffer = np.zeros(0, dtype=np.int64)
        self.start = 0  # tokens before this index were emitted (kept until the next add)

    def add(self, ids) -> None:
        self.buffer = np.concatenate([self.buffer[self.start :], np.asarray(ids, np.int64)])
        self.start = 0

    def pop(self) -> dict[str, torch.Tensor] | None:
        """The next complete window, or None; its last token stays as the next one's first."""
        if len(self.buffer) - self.start <= self.seq_len:
            return None
        window = self.window(self.buffer[self.start : self.start + self.seq_len + 1])
        self.start += self.seq_len
        return window

    def flush(self) -> Iterator[dict[str, torch.Tensor]]:
        """The remaining tokens as a last window padded with ignored targets (evaluation)."""
        rest = self.buffer[self.start :]
        n = len(rest)
        if n > 1:
            padded = np.full(self.seq_len + 1, self.eos_id, dtype=np.int64)
            padded[:n] = rest
            window = self.window(padded)
            window["targets"][n - 1 :] = IGNORE_INDEX
            yield window
        self.buffer, self.start = np.zeros(0, dtype=np.int64), 0

    def window(self, ids) -> dict[str, torch.Tensor]:
        tokens = torch.from_numpy(np.array(ids, dtype=np.int64))  # a copy, owned by the window
        out = {"inputs": tokens[:-1], "targets": tokens[1:].clone()}
        if self.document_mask:
            out["document_ids"] = document_index(out["inputs"], self.eos_id)
        return out

    def state_dict(self) -> dict:
        return {"buffer": torch.from_numpy(self.buffer[self.start :].copy())}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = np.asarray(state["buffer"], dtype=np.int64).copy()
        self.start = 0


def pack(documents: Iterable, packer: Packer) -> Iterator[dict[str, torch.Tensor]]:
    """Every window of ``documents`` (token arrays, in order), the last one padded: the
    validation slice, which must be evaluated to its last token."""
    for ids in documents:
        packer.add(ids)
        while (window := packer.pop()) is not None:
            yield window
    yield from packer.flush()


def pack_document(
    packer: Packer, tokenizer: Tokenizer, text: str, add_bos: bool, stats: MutableMapping[str, int]
) -> Iterator[dict[str, torch.Tensor]]:
    """Encode one training document, count it, add it to ``packer``; yield the windows it fills.

    The one step every text-reading training stream shares (``data.text``, ``fineweb_edu``),
    kept in one place so the streams cannot drift apart by a token. The counters are updated
    before the first window is yielded: a ``state_dict()`` taken while the stream is suspended
    on a window already counts the document whose tokens are in the packer's buffer.
    """
    ids = encode_document(tokenizer, text, add_bos)
    stats["documents"] += 1
    stats["tokens"] += len(ids)
    packer.add(ids)
    while (window := packer.pop()) is not None:
        yield window


def document_index(inputs: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Per position, the index of its document within the window (a new one after each EOS).

    The batch key ``"document_ids"``, which ``Llama.forward`` takes: two positions may attend
    to each other only when their indices are equal.
    """
    after_eos = torch.zeros_like(inputs)
    after_eos[1:] = (inputs[:-1] == eos_id).long()
    return after_eos.cumsum(0)
