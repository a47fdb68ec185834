"""AdamW with weight decay only where it makes sense, decided by parameter role."""

from __future__ import annotations

import torch
from torch import nn

from training.config import OptimConfig


def parameter_groups(model: nn.Module, config: OptimConfig) -> list[dict]:
    """Decayed parameters (matrices, and whatever the config opts in), not decayed ones, and,
    when the model has any, the activation scalars in a group of their own.

    Roles: activation scalars (the ones each layer's activation declares, see
    ``Llama.activation_scalar_parameters``) decay only with ``decay_activation_scalars`` and
    train at ``optim.scalar_lr_multiplier`` times the schedule's rate (the group's
    ``lr_multiplier``, applied by :func:`set_learning_rate`); then by name and shape, matrices
    (ndim >= 2) decay, 1-d norm weights and the embedding only with
    ``decay_norms_and_embeddings``. A tied LM head is the embedding and follows it. ``model``
    is the bare model (``TrainingModel.bare``: the same parameter objects DDP and FSDP2
    train); parameters keep their order within each group.
    """
    activation_scalars = {id(p) for p in model.activation_scalar_parameters()}
    decay, no_decay, scalars = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in activation_scalars:
            scalars.append(param)
            continue
        if "embed_tokens" in name or param.ndim < 2:
            wants_decay = config.decay_norms_and_embeddings
        else:
            wants_decay = True
        (decay if wants_decay else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay, "lr_multiplier": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_multiplier": 1.0},
    ]
    if scalars:
        groups.append(
            {
                "params": scalars,
                "weight_decay": config.weight_decay if config.decay_activation_scalars else 0.0,
                "lr_multiplier": config.scalar_lr_multiplier,
            }
        )
    return groups


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's rate for this step, times each group's ``lr_multiplier``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_multiplier", 1.0)


def build_optimizer(model: nn.Module, config: OptimConfig, device: torch.device):
    fused = config.fused if config.fused is not None else device.type == "cuda"
    return torch.optim.AdamW(
        parameter_groups(model, config),
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        fused=fused or None,
        foreach=None if fused else True,
    )
