"""Per-layer gradient norms: attention, MLP and the activation's scalars of every block.

The global norm (``grad_norm``) says that a step was large; these say where. Measured on the
summed gradient of the step, before clipping. Each block's parameters are grouped by role:

- ``attn``: the attention projections and the norm in front of them (``input_layernorm``);
- ``mlp``: the MLP's matrices and its norm (``post_attention_layernorm``);
- ``act``: the activation's trainable scalars (xIELU's alpha_p and alpha_n, a trainable beta).

Under DDP every rank holds the whole (reduced) gradient; under FSDP2 each holds a shard of a
DTensor, so the squared sums of the local shards are summed over ranks, and the parameters that
bf16 FSDP2 keeps whole on every rank (norms, activation scalars) are counted once.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from training.components import Component, Context
from training.runtime import distributed

GROUPS = ("attn", "mlp", "act")


def _group(name: str) -> str | None:
    if name.startswith("mlp.act_fn."):
        return "act"
    if name.startswith(("mlp.", "post_attention_layernorm.")):
        return "mlp"
    if name.startswith(("self_attn.", "input_layernorm.")):
        return "attn"
    return None


@torch.no_grad()
def per_layer_grad_norms(model, device: torch.device) -> dict[str, float]:
    """``grad_norm/<group>/layer_NN`` for every block of ``model`` (a TrainingModel, or the
    bare model in a single process); every rank calls it under FSDP2. A group without
    parameters (``act`` of ReLU², SwiGLU) is left out."""
    layers = getattr(model, "bare", model).layers
    sums = torch.zeros(len(layers), len(GROUPS), dtype=torch.float64, device=device)
    whole = torch.zeros_like(sums)  # gradients every rank holds in full
    present = torch.zeros(len(layers), len(GROUPS), dtype=torch.bool)
    sharded = False
    for i, layer in enumerate(layers):
        for name, param in layer.named_parameters():
            group = _group(name)
            if group is None:
                continue
            j = GROUPS.index(group)
            present[i, j] = True
            grad = param.grad
            if grad is None:
                continue
            if hasattr(grad, "to_local"):  # a DTensor shard (FSDP2)
                sharded = True
                sums[i, j] += grad.to_local().detach().double().pow(2).sum()
            else:
                whole[i, j] += grad.detach().double().pow(2).sum()
    flat = sums.flatten().tolist()
    if sharded:
        flat = distributed.all_reduce_sum(flat, device)
    flat = [a + b for a, b in zip(flat, whole.flatten().tolist(), strict=True)]
    return {
        f"grad_norm/{group}/layer_{i:02d}": math.sqrt(flat[i * len(GROUPS) + j])
        for i in range(len(layers))
        for j, group in enumerate(GROUPS)
        if present[i, j]
    }


class GradNorms(Component):
    """Every ``logging.grad_norms_every`` steps, on the step's complete gradients before they
    are clipped, logged at that step. A step's own measurement: nothing is left for later."""

    name = "grad_norms"
    on_cadence = ("before_clip",)

    def __init__(self, every: int) -> None:
        self.every = every

    @classmethod
    def from_context(cls, context: Context) -> GradNorms:
        return cls(context.config.logging.grad_norms_every)

    def before_clip(self, trainer: Any, step: int) -> None:
        norms = per_layer_grad_norms(trainer.model, trainer.env.device)  # a collective
        trainer.log(norms, console=False, step=step)
