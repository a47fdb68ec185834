"""The training loss's own settings (the ``loss`` section: the z-loss, and which targets it
leaves out: Goldfish's hashed one in k, and end-of-document inputs).

**Goldfish loss** (Hans et al. 2024, "Be like a Goldfish, Don't Memorize!"): a target token is
left out of the loss when a hash of the ``h`` ids around it falls in a 1/k bucket, so a model
never sees the loss of a part of the tokens of a text, and cannot reproduce a memorised
passage verbatim. The decision depends on those ``h`` ids alone: the same text drops the same
tokens wherever it lands, on every rank, after a resume and at any world size. Two rules
(``loss.goldfish_rule``):

- ``table``, the rule of the code Apertus trained with (the Goldfish authors' ``hash-table``
  strategy, which swiss-ai's Megatron carries): the key of the target at position ``j`` is the
  product of the ``h`` labels of the window ending at it, target included (targets
  ``j - h + 1 ... j``), in int64 as the GPU computes it (wrapping past 2^63), mod 1,000,003;
  the target is dropped when a fixed table of 1,000,003 uniform numbers holds less than 1/k
  there. The table is drawn once from a CPU generator seeded 2,971,215,073 (the authors' seed),
  the same on every device; their code draws it with the targets' device's generator, so on a
  GPU its values, and the dropped sets, are not these. Products of ``h`` ids overflow: once 64
  factors of two have gathered the product is 0 mod 2^64, every such key is 0 and shares one
  decision, so far fewer than 1/k are dropped on real text (docs/training.md: measured).
- ``paper``, the paper's wording: a hash of the ``h`` ids *before* the target (inputs
  ``j - h + 1 ... j``, which end at the target's own input), ``v = sum_m (id_m + 1) B^(h-1-m)
  mod M`` by Horner's rule in int64 (``M = 2^31 - 1``, a prime; ``B`` a fixed base below it);
  dropped when ``v mod k == 0``, 1/k of random ids.

Under both the first ``h - 1`` targets of a window are never dropped (the windows are cut from
a stream at positions that change with the sequence length, so the ids before a window are not
part of it); at the paper's 4096 tokens and ``h = 50`` that keeps 1.2% of a window out of reach.

**End-of-document mask** (Megatron's ``--eod-mask-loss``): a position whose input is the
end-of-document token predicts the first token of an unrelated next document; with the mask
on, that target is left out.

Both apply to training only. Validation and evaluation score every token (``data/validation``,
``eval/``): their losses stay comparable across runs with and without these settings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from data.packing import IGNORE_INDEX
from settings import ConfigError, Run, Section, at_least, one_of

GOLDFISH_RULES = ("table", "paper")
# Goldfish's paper rule takes an int64 hash of the ids modulo k
GOLDFISH_K_MAX = 2**63 - 1


@dataclass
class LossConfig(Section):
    """``loss``: what the training loss adds and leaves out. With either mask the training loss
    is the mean over the counted targets of the whole global batch; validation and evaluation
    count every target and never add the z-loss.

    Attributes:
        z_loss: coefficient of the z-loss ``z * logsumexp(logits)^2`` (PaLM uses 1e-4), added to
            the training loss inside the fused LM-head loss (``model/loss.py``); 0, the paper,
            adds nothing. The logged training loss includes it.
        goldfish_k: Goldfish loss: leave out of the training loss the targets whose
            ``goldfish_h`` preceding ids hash into a 1/k bucket (Apertus: 50); 0 (the paper)
            leaves none out; 1 would leave out all and is refused.
        goldfish_h: how many token ids Goldfish hashes (Apertus: 50).
        goldfish_rule: ``table`` (the code Apertus trained with: the product of the ``h``
            labels ending at the target, looked up in a seeded table) or ``paper`` (a hash of
            the ``h`` ids before the target, the paper's wording).
        eod_mask: leave out of the training loss the positions whose input is the
            end-of-document token (Megatron's ``--eod-mask-loss``; Apertus: on).
    """

    z_loss: float = 0.0
    goldfish_k: int = 0
    goldfish_h: int = 50
    goldfish_rule: str = "table"
    eod_mask: bool = False

    def check(self, run: Run | None = None) -> None:
        at_least("loss.z_loss", self.z_loss, 0)
        at_least("loss.goldfish_k", self.goldfish_k, 0)
        at_least("loss.goldfish_h", self.goldfish_h, 1)
        one_of("loss.goldfish_rule", self.goldfish_rule, GOLDFISH_RULES)
        if self.goldfish_k > GOLDFISH_K_MAX:
            raise ConfigError(
                f"loss.goldfish_k={self.goldfish_k} is past 2**63 - 1: the ids' hash is an int64 "
                "taken modulo k (and 1/k of the targets is already none at far smaller k)"
            )
        if self.goldfish_k == 1:
            raise ConfigError(
                "loss.goldfish_k=1 would leave every target out of the loss: 0 turns Goldfish "
                "off, k >= 2 leaves out about 1/k"
            )
        seq_len = run.config.data.seq_len if run else None
        if seq_len is not None and self.goldfish_k and self.goldfish_h >= seq_len:
            raise ConfigError(
                f"loss.goldfish_h={self.goldfish_h} is not below data.seq_len={seq_len}: no "
                "target of a window has that many ids before it, so Goldfish would leave out "
                "nothing"
            )


HASH_MODULUS = 2**31 - 1
HASH_BASE = 1_000_003  # below the modulus: every product of two residues fits in int64
TABLE_SIZE = 1_000_003  # the ``table`` rule's (a prime)
TABLE_SEED = 2_971_215_073  # the Goldfish authors' (the 47th Fibonacci number, a prime)


@functools.cache
def goldfish_table() -> Tensor:
    """The ``table`` rule's uniform numbers, drawn once on the CPU (module doc)."""
    generator = torch.Generator().manual_seed(TABLE_SEED)
    return torch.rand(TABLE_SIZE, generator=generator)


def goldfish_table_dropped(targets: Tensor, k: int, h: int) -> Tensor:
    """Boolean [batch, seq]: the targets the ``table`` rule leaves out (module doc)."""
    batch, seq = targets.shape
    dropped = torch.zeros(batch, seq, dtype=torch.bool, device=targets.device)
    if seq < h:
        return dropped
    keys = targets.long().unfold(1, h, 1).prod(dim=-1) % TABLE_SIZE  # wraps as on a GPU
    table = goldfish_table().to(targets.device)
    dropped[:, h - 1 :] = table[keys] < 1 / k
    return dropped


def goldfish_dropped(inputs: Tensor, k: int, h: int) -> Tensor:
    """Boolean [batch, seq]: the targets of ``inputs`` that the ``paper`` rule leaves out."""
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
    """The training loss's mask from ``loss.goldfish_k`` / ``loss.goldfish_h`` and
    ``loss.eod_mask``; :meth:`apply` returns a batch whose left-out targets are
    ``IGNORE_INDEX``, which the fused loss skips."""

    def __init__(
        self,
        goldfish_k: int,
        goldfish_h: int,
        eod_mask_loss: bool,
        eos_id: int,
        goldfish_rule: str = "table",
    ):
        self.goldfish_k, self.goldfish_h = goldfish_k, goldfish_h
        self.eod_mask_loss, self.eos_id = eod_mask_loss, eos_id
        self.goldfish_rule = goldfish_rule

    @classmethod
    def from_config(cls, loss: LossConfig, eos_id: int) -> LossMask:
        """From the ``loss`` section."""
        return cls(loss.goldfish_k, loss.goldfish_h, loss.eod_mask, eos_id, loss.goldfish_rule)

    @property
    def active(self) -> bool:
        return self.goldfish_k > 0 or self.eod_mask_loss

    def apply(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        inputs, targets = batch["inputs"], batch["targets"]
        dropped = torch.zeros_like(targets, dtype=torch.bool)
        if self.goldfish_k and self.goldfish_rule == "table":
            dropped |= goldfish_table_dropped(targets, self.goldfish_k, self.goldfish_h)
        elif self.goldfish_k:
            dropped |= goldfish_dropped(inputs, self.goldfish_k, self.goldfish_h)
        if self.eod_mask_loss:
            dropped |= inputs == self.eos_id
        return {**batch, "targets": targets.masked_fill(dropped, IGNORE_INDEX)}
