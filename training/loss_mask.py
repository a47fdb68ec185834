"""Which targets the training loss leaves out: Goldfish's hashed one in k, and end-of-document
inputs.

**Goldfish loss** (Hans et al. 2024, "Be like a Goldfish, Don't Memorize!"): a target token is
left out of the loss when a hash of the ``h`` token ids before it falls in a 1/k bucket, so a
model never sees the loss of about 1/k of the tokens of a text, and cannot reproduce a
memorised passage verbatim. The decision depends on those ``h`` ids alone: the same text
drops the same tokens wherever it lands, on every rank, after a resume and at any world size.
(The ``h`` ids are the window's as packed: for the first ``h`` targets of a document they
include the end of the document before it, as the Goldfish paper hashes its context.)

- The target at position ``j`` of a window is input ``j + 1``; the ``h`` ids before it are
  inputs ``j - h + 1 ... j``. The first ``h - 1`` targets of a window have fewer than ``h``
  ids before them in the window and are never dropped (the windows are cut from a stream at
  positions that change with the sequence length, so the ids before a window are not part of
  it). At the paper's 4096 tokens and ``h = 50`` that keeps 1.2% of a window out of reach.
- The hash: ``v = sum_m (id_m + 1) B^(h-1-m) mod M``, Horner's rule in int64 (``M = 2^31 - 1``,
  a prime; ``B`` a fixed base below it), the same on every device; the target is dropped when
  ``v mod k == 0``. On random ids that is 1/k of the targets.

**End-of-document mask** (Megatron's ``--eod-mask-loss``): a position whose input is the
end-of-document token predicts the first token of an unrelated next document; with the mask
on, that target is left out.

Both apply to training only. Validation and evaluation score every token (``data/validation``,
``eval/``): their losses stay comparable across runs with and without these settings.
"""

from __future__ import annotations

import torch
from torch import Tensor

from data.packing import IGNORE_INDEX

HASH_MODULUS = 2**31 - 1
HASH_BASE = 1_000_003  # below the modulus: every product of two residues fits in int64


def goldfish_dropped(inputs: Tensor, k: int, h: int) -> Tensor:
    """Boolean [batch, seq]: the targets of ``inputs`` that Goldfish leaves out (module doc)."""
    batch, seq = inputs.shape
    dropped = torch.zeros(batch, seq, dtype=torch.bool, device=inputs.device)
    if seq < h:
        return dropped
    positions = seq - h + 1  # targets h - 1 ... seq - 1 have h ids before them
    ids = inputs.long()
    value = torch.zeros(batch, positions, dtype=torch.long, device=inputs.device)
    for m in range(h):
        value = (value * HASH_BASE + ids[:, m : m + positions] + 1) % HASH_MODULUS
    dropped[:, h - 1 :] = value % k == 0
    return dropped


class LossMask:
    """The training loss's mask from ``optim.goldfish_k`` / ``optim.goldfish_h`` and
    ``optim.eod_mask_loss``; :meth:`apply` returns a batch whose left-out targets are
    ``IGNORE_INDEX``, which the fused loss skips."""

    def __init__(self, goldfish_k: int, goldfish_h: int, eod_mask_loss: bool, eos_id: int):
        self.goldfish_k, self.goldfish_h = goldfish_k, goldfish_h
        self.eod_mask_loss, self.eos_id = eod_mask_loss, eos_id

    @classmethod
    def from_config(cls, optim, eos_id: int) -> LossMask:
        """From ``optim.goldfish_k``, ``optim.goldfish_h`` and ``optim.eod_mask_loss``."""
        return cls(optim.goldfish_k, optim.goldfish_h, optim.eod_mask_loss, eos_id)

    @property
    def active(self) -> bool:
        return self.goldfish_k > 0 or self.eod_mask_loss

    def apply(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        inputs, targets = batch["inputs"], batch["targets"]
        dropped = torch.zeros_like(targets, dtype=torch.bool)
        if self.goldfish_k:
            dropped |= goldfish_dropped(inputs, self.goldfish_k, self.goldfish_h)
        if self.eod_mask_loss:
            dropped |= inputs == self.eos_id
        return {**batch, "targets": targets.masked_fill(dropped, IGNORE_INDEX)}
