"""Muon for the hidden matrices, AdamW for every other parameter, as one optimizer.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"): a matrix's
update is its Nesterov momentum made orthogonal, ``U V^T`` of its SVD, computed by five steps of
the quintic Newton-Schulz iteration whose coefficients (3.4445, -4.7750, 2.0315) torch's
``torch.optim.Muon`` uses too; decoupled weight decay as in AdamW. The update is scaled by
``sqrt(max(1, rows / cols))`` (torch's ``adjust_lr_fn="original"``), so its spectral norm is
``lr * sqrt(max(1, fan_out / fan_in))`` at every width: the spectral condition for feature
learning (Yang, Simon and Bernstein 2023), which is what µP asks of a hidden matrix. So under
``model.parametrization=mup`` the Muon matrices take no ``1 / m`` factor on their rate; the AdamW
groups (embedding, LM head, norms, the activation's scalars) keep µP's rules for Adam
(``training.parameter_groups.parameter_groups``).

Why not ``torch.optim.Muon`` itself: it takes 2-D parameters only (the AdamW part would be a
second optimizer, a second state to checkpoint and resume), and under FSDP2 it would
orthogonalize each rank's shard of a matrix rather than the matrix. Here a sharded matrix
(a DTensor) is gathered whole, orthogonalized on one rank (the i-th matrix on rank ``i %
world_size``, so the work is spread over the ranks), broadcast, and each rank keeps its shard:
the same update as one process, to float32 rounding (``tests/test_muon.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim.adamw import adamw

from settings import Run, Section, fraction, positive


@dataclass
class MuonConfig(Section):
    """``optim.muon``: Muon's own knobs; every other parameter trains with AdamW at ``optim.lr``
    with the shared betas, eps and decay.

    Attributes:
        lr: Muon's peak rate for the hidden matrices (an update of spectral norm
            ``lr * sqrt(max(1, fan_out / fan_in))``; µP needs no width factor on it), on the
            schedule's shape.
        momentum: Muon's (Nesterov) momentum.
    """

    lr: float = 0.02
    momentum: float = 0.95

    def check(self, run: Run | None = None) -> None:
        positive("optim.muon.lr", self.lr)
        fraction("optim.muon.momentum", self.momentum)


def build(groups: list[dict], optim: Any, device: torch.device) -> MuonAdamW:
    """``optim.name=muon`` (``training.optim.OPTIMIZERS``): the matrices' group (``muon: True``,
    from ``training.parameter_groups.parameter_groups``) and the AdamW rest, as one optimizer."""
    return MuonAdamW(
        groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, momentum=optim.muon.momentum
    )


NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's quintic coefficients
NEWTON_SCHULZ_STEPS = 5


def orthogonalize(matrix: torch.Tensor, steps: int = NEWTON_SCHULZ_STEPS) -> torch.Tensor:
    """About ``U V^T`` of ``matrix``'s SVD (singular values near 1, within about [0.7, 1.2]),
    by the quintic Newton-Schulz iteration, in float32; the matrix is first scaled to a
    spectral norm of at most 1 (by its Frobenius norm)."""
    a, b, c = NEWTON_SCHULZ
    x = matrix.float()
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the wide form: X X^T is the smaller product
        x = x.mT
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).contiguous()


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over parameter groups of two kinds: ``muon: True`` (2-D matrices; ``lr``,
    ``weight_decay``, ``momentum``, ``nesterov``) and the others (AdamW: ``lr``, ``betas``,
    ``eps``, ``weight_decay``). Works on plain tensors (one process, DDP: the gradients are
    already the same on every rank) and on FSDP2's DTensors."""

    def __init__(
        self,
        params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            muon=False,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.ndim != 2 for p in group["params"]):
                raise ValueError("Muon's groups hold 2-D matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0  # the matrices' order, the same on every rank: which rank orthogonalizes
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group, index)
                index += len(group["params"])
            else:
                self._adamw_step(group)
        return loss

    def _muon_step(self, group: dict, first_index: int) -> None:
        """The group's Muon update: momentum and decay in foreach ops over the group, each
        matrix's orthogonalized step by ``_orthogonal``."""
        indexed = [(i, p) for i, p in enumerate(group["params"], first_index) if p.grad is not None]
        if not indexed:
            return
        params = [p for _, p in indexed]
        for p in params:
            if not self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        grads = [p.grad for p in params]
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(buffers, grads, 1 - group["momentum"])
        if group["nesterov"]:
            updates = torch._foreach_lerp(grads, buffers, group["momentum"])
        else:
            updates = buffers
        steps = []
        for (i, p), update in zip(indexed, updates, strict=True):
            rows, cols = p.shape
            scale = max(1.0, rows / cols) ** 0.5
            steps.append(_orthogonal(update, i).mul_(-group["lr"] * scale))
        torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_add_(params, steps)

    def _adamw_step(self, group: dict) -> None:
        """The group's AdamW update by torch's own function (``torch.optim.AdamW``'s, foreach)."""
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            foreach=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )


def _orthogonal(update: torch.Tensor, index: int) -> torch.Tensor:
    """``orthogonalize(update)`` of the whole matrix; a DTensor's is computed on one rank of its
    mesh (``index % size``), broadcast, and handed back as the same shards."""
    if not isinstance(update, DTensor):
        return orthogonalize(update).to(update.dtype)
    mesh, placements = update.device_mesh, update.placements
    group = mesh.get_group()
    whole = update.full_tensor().float()
    owner = index % dist.get_world_size(group)
    if dist.get_rank(group) == owner:
        whole = orthogonalize(whole)
    dist.broadcast(whole, src=dist.get_global_rank(group, owner), group=group)
    return distribute_tensor(whole.to(update.dtype), mesh, placements, src_data_rank=None)
