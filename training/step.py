"""One optimizer step: forward and backward over the micro-batches, gradient clipping, the update.

The trainer takes it (``training/loop.py``), and so do the benchmarks
(``scripts/bench/throughput.py``) and the memory estimate (``scripts/estimate_memory.py``), so
that what they time and count is the step that trains, not a copy that drifts from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from data.packing import IGNORE_INDEX
from training.loss_mask import LossMask
from training.runtime import distributed
from training.runtime.parallelize import TrainingModel


@dataclass
class StepResult:
    """``loss_sum``: this rank's micro-batch losses summed (fp64, on the device); ``grad_norm``:
    the global gradient norm before clipping; ``stepped``: whether the optimizer updated. Both
    stay tensors: reading them waits for the device, which the caller decides to do.
    ``measured``: what the step logs besides (with a loss mask, the fraction of the global
    batch's targets it left out, ``loss_mask/dropped``)."""

    loss_sum: torch.Tensor
    grad_norm: torch.Tensor
    stepped: bool
    measured: dict[str, float] = field(default_factory=dict)


def _nothing(phase: str) -> None:
    pass


def train_step(
    model: TrainingModel,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[dict],
    accumulation: int,
    grad_clip: float,
    *,
    should_update: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
    on_phase: Callable[[str], None] = _nothing,
    before_clip: Callable[[], None] | None = None,
    loss_mask: LossMask | None = None,
    z_loss: float = 0.0,
) -> StepResult:
    """Take ``accumulation`` micro-batches from ``batches``; gradients of their mean loss.

    With an active ``loss_mask`` (Goldfish, the end-of-document mask) the micro-batches hold
    different numbers of counted targets, and the mean is over the counted targets of the whole
    global batch (:func:`token_weights`): it does not change with the micro-batch size or the
    world size. Without one every micro-batch counts the same, and the mean of their means is
    that mean. ``z_loss``: the z-loss coefficient (``loss.z_loss``) the model adds to each
    micro-batch's loss.

    Gradients are synchronised over ranks on the last micro-batch only (or as
    ``TrainingModel.gradient_sync`` says), clipped to ``grad_clip`` (0: measured, not clipped),
    and applied unless ``should_update(loss_sum, grad_norm)`` says no (the trainer skips
    non-finite steps there); the gradients are freed either way. ``on_phase`` is called after
    each forward, backward and the update (the memory estimate records its peaks there);
    ``before_clip`` once the step's gradients are complete and not yet clipped (the per-layer
    gradient norms are read there).
    """
    device = model.env.device

    def to_device(batch: dict) -> dict:
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    weights, measured = [1.0] * accumulation, {}
    if loss_mask is not None and loss_mask.active:
        # masked and counted where the loader made them (the CPU): no device sync per batch
        raw = [next(batches) for _ in range(accumulation)]
        masked = [loss_mask.apply(batch) for batch in raw]
        counts = [counted_targets(batch) for batch in masked]
        before, after = distributed.all_reduce_sum(
            [float(sum(counted_targets(batch) for batch in raw)), float(sum(counts))], device
        )
        weights = token_weights(counts, accumulation * model.env.world_size, after)
        measured["loss_mask/dropped"] = 1 - after / before if before else 0.0
        batches = iter(masked)
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    for micro in range(accumulation):
        batch = to_device(next(batches))
        last = micro == accumulation - 1
        with model.gradient_sync(last), model.autocast():
            loss = model(
                batch["inputs"], batch["targets"], batch.get("document_ids"), z_loss=z_loss
            )
        on_phase(f"forward {micro + 1}")
        if weights[micro] != 1.0:
            loss = loss * weights[micro]
        (loss / accumulation).backward()
        loss_sum += loss.detach().double()
        del loss
        on_phase(f"backward {micro + 1}")
    model.finish_gradients()
    if before_clip is not None:
        before_clip()
    grad_norm = model.clip_grad_norm_(grad_clip or math.inf)
    stepped = should_update is None or should_update(loss_sum, grad_norm)
    if stepped:
        optimizer.step()
    on_phase("optimizer")
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum, grad_norm, stepped, measured)


def counted_targets(batch: dict) -> int:
    return int((batch["targets"] != IGNORE_INDEX).sum())


def token_weights(counts: list[int], micro_batches_in_all: int, total: float) -> list[float]:
    """Each micro-batch's weight ``w_i``: its mean loss times ``w_i``, averaged over the
    ``micro_batches_in_all`` micro-batches of every rank as the step averages them, gives the
    mean over every counted target of the global batch, ``total`` of them:
    ``w_i = c_i * micro_batches_in_all / total``. Exactly 1 when every micro-batch counts the
    same (the step then takes the plain path, bit for bit)."""
    return [c * micro_batches_in_all / total if total else 0.0 for c in counts]
