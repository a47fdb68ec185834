"""One optimizer step: forward and backward over the micro-batches, gradient clipping, the update.

The trainer takes it (``training/loop.py``), and so do the benchmarks
(``scripts/bench_throughput.py``) and the memory estimate (``scripts/estimate_memory.py``), so
that what they time and count is the step that trains, not a copy that drifts from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from training.runtime.parallelize import TrainingModel


@dataclass
class StepResult:
    """``loss_sum``: this rank's micro-batch losses summed (fp64, on the device); ``grad_norm``:
    the global gradient norm before clipping; ``stepped``: whether the optimizer updated. Both
    stay tensors: reading them waits for the device, which the caller decides to do."""

    loss_sum: torch.Tensor
    grad_norm: torch.Tensor
    stepped: bool


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
) -> StepResult:
    """Take ``accumulation`` micro-batches from ``batches``; gradients of their mean loss.

    Gradients are synchronised over ranks on the last micro-batch only (or as
    ``TrainingModel.gradient_sync`` says), clipped to ``grad_clip`` (0: measured, not clipped),
    and applied unless ``should_update(loss_sum, grad_norm)`` says no (the trainer skips
    non-finite steps there); the gradients are freed either way. ``on_phase`` is called after
    each forward, backward and the update (the memory estimate records its peaks there);
    ``before_clip`` once the step's gradients are complete and not yet clipped (the per-layer
    gradient norms are read there).
    """
    device = model.env.device
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    for micro in range(accumulation):
        batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
        last = micro == accumulation - 1
        with model.gradient_sync(last), model.autocast():
            loss = model(batch["inputs"], batch["targets"], batch.get("document_ids"))
        on_phase(f"forward {micro + 1}")
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
    return StepResult(loss_sum, grad_norm, stepped)
