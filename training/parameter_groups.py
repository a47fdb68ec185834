"""The parameter groups every optimizer shares: weight decay only where it makes sense, decided
by parameter role, µP's per-group rates, and a group of its own for the hidden matrices of an
optimizer that trains them at a rate of their own (Muon)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """A matrix whose both dimensions grow with width: every matrix but the embedding and the
    LM head (µP's hidden group, and the matrices Muon trains)."""
    return param.ndim >= 2 and "embed_tokens" not in name and not name.startswith("lm_head")


def hidden_matrix_shapes(model_config) -> list[tuple[int, int]]:
    """The shapes of a model's hidden matrices (:func:`is_hidden_matrix`: those Muon trains),
    in the model's order, from a model built on the meta device (no memory)."""
    from model import Llama

    with torch.device("meta"):
        model = Llama(model_config)
    return [tuple(p.shape) for name, p in model.named_parameters() if is_hidden_matrix(name, p)]


def parameter_groups(model: nn.Module, config: Any) -> list[dict]:
    """Decayed parameters (matrices, and whatever the config opts in), not decayed ones, and,
    when the model has any, the activation scalars in a group of their own; under µP
    (``model.parametrization=mup``) the hidden matrices in a first group of their own, at
    ``lr`` / m with weight decay x m (m = dim / mup_base_dim).

    Roles: activation scalars (the ones each layer's activation declares, see
    ``Llama.activation_scalar_parameters``) decay only with ``decay_activation_scalars`` and
    train at ``optim.scalar_lr_multiplier`` times the schedule's rate (the group's
    ``lr_multiplier``, applied by :func:`set_learning_rate`); then by name and shape, matrices
    (ndim >= 2) decay, 1-d norm weights and the embedding only with
    ``decay_norms_and_embeddings``. A tied LM head is the embedding and follows it. ``model``
    is the bare model (``TrainingModel.bare``: the same parameter objects DDP and FSDP2
    train); parameters keep their order within each group.

    Under an optimizer with a rate of its own for the hidden matrices (``optim.name=muon``:
    ``optim.muon.lr``) the attention and MLP matrices (every matrix but the embedding and the
    LM head) form a first group of their own, ``muon: True``, decayed, at that rate (its
    ``lr_multiplier`` is that rate / ``optim.lr``) and with no µP factor (``training.muon`` says
    why); every other parameter is grouped as above, for AdamW.
    """
    activation_scalars = {id(p) for p in model.activation_scalar_parameters()}
    mup = model.config.parametrization == "mup"
    matrix_rate = config.matrix_rate
    muon = matrix_rate is not None
    decay, no_decay, scalars, hidden, matrices = [], [], [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in activation_scalars:
            scalars.append(param)
            continue
        if is_hidden_matrix(name, param) and (muon or mup):
            (matrices if muon else hidden).append(param)
            continue
        wants_decay = ("embed_tokens" not in name and param.ndim >= 2) or (
            config.decay_norms_and_embeddings
        )
        (decay if wants_decay else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay, "lr_multiplier": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_multiplier": 1.0},
    ]
    if mup:
        # µP for Adam: a hidden matrix's update must shrink as 1/width to keep its effect on
        # the next layer's input width-independent; decoupled weight decay multiplies by lr, so
        # it grows by the same factor and lr x wd, the decay per step, stays what it was tuned
        m = model.config.width_multiplier
        hidden_group = {
            "params": hidden,
            "weight_decay": config.weight_decay * m,
            "lr_multiplier": 1 / m,
        }
        groups = [hidden_group, *groups]
        groups = [group for group in groups if group["params"]]  # a tied head: no decay group
    if matrices:
        muon_group = {
            "params": matrices,
            "muon": True,
            "weight_decay": config.weight_decay,
            "lr_multiplier": matrix_rate[1] / config.lr,
        }
        groups = [group for group in (muon_group, *groups) if group["params"]]
    if scalars:
        groups.append(
            {
                "params": scalars,
                "weight_decay": config.weight_decay if config.decay_activation_scalars else 0.0,
                "lr_multiplier": config.scalar_lr_multiplier,
            }
        )
    return [part for group in groups for part in _by_layout(group)]


def _by_layout(group: dict) -> list[dict]:
    """``group`` split into its whole parameters and its DTensor shards: under bf16 FSDP2 a role
    holds both (``training.runtime.parallelize.apply_fsdp`` keeps the norms whole on every rank, the
    embedding is sharded), and the foreach and fused AdamW kernels refuse a list that mixes
    them. One group when the layouts agree (DDP, one process, fp32 FSDP2)."""
    whole = [p for p in group["params"] if not hasattr(p, "to_local")]
    sharded = [p for p in group["params"] if hasattr(p, "to_local")]
    if not whole or not sharded:
        return [group]
    return [{**group, "params": whole}, {**group, "params": sharded}]


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's rate for this step, times each group's ``lr_multiplier``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_multiplier", 1.0)
