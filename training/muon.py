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
orthogonalize each rank's shard of a matrix rather than the matrix. Here each sharded matrix (a
DTensor, FSDP2's row shards) is gathered to the one rank that orthogonalizes it (the i-th matrix
on rank ``i % world_size``, so the work is spread over the ranks), and only each rank's rows of
the result are scattered back (:func:`exchange`): the same update as one process, to float32
rounding (``tests/test_muon.py``). All the gathers of a step are issued at once, then all the
scatters, so that they overlap rather than wait one by one; a rank moves about its share of the
bytes, not the whole of every matrix (docs/performance.md: the count per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
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


@dataclass
class NorMuonConfig(Section):
    """``optim.normuon``: NorMuon (Li et al. 2025, "NorMuon: Making Muon more efficient and
    scalable", the optimizer modded-nanogpt's and nanochat's records use): Muon whose
    orthogonalized update is divided, row by row (one output neuron each), by the square root
    of a running mean of that row's squared entries, then rescaled to the Frobenius norm it had
    (:meth:`MuonAdamW._normalize_rows`). The rows' norms of an orthogonal update differ; this
    evens them out without changing the update's size, so µP's reading of Muon stands: the
    update keeps Muon's spectral scale to within the spread of its rows' norms.

    Attributes:
        lr: the hidden matrices' peak rate (as ``optim.muon.lr``).
        momentum: the (Nesterov) momentum.
        beta2: the decay of the rows' second moment (the authors': 0.95).
    """

    lr: float = 0.02
    momentum: float = 0.95
    beta2: float = 0.95

    def check(self, run: Run | None = None) -> None:
        positive("optim.normuon.lr", self.lr)
        fraction("optim.normuon.momentum", self.momentum)
        fraction("optim.normuon.beta2", self.beta2)


def build(groups: list[dict], optim: Any, device: torch.device) -> MuonAdamW:
    """``optim.name=muon`` (``training.optim.OPTIMIZERS``): the matrices' group (``muon: True``,
    from ``training.parameter_groups.parameter_groups``) and the AdamW rest, as one optimizer."""
    return MuonAdamW(
        groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, momentum=optim.muon.momentum
    )


def build_normuon(groups: list[dict], optim: Any, device: torch.device) -> MuonAdamW:
    """``optim.name=normuon``: Muon's optimizer with the rows' normalization on."""
    n = optim.normuon
    return MuonAdamW(
        groups,
        lr=optim.lr,
        betas=tuple(optim.betas),
        eps=optim.eps,
        momentum=n.momentum,
        row_beta2=n.beta2,
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


def newton_schulz_flops(rows: int, cols: int, steps: int = NEWTON_SCHULZ_STEPS) -> int:
    """The matmul FLOPs of :func:`orthogonalize` on a ``rows`` x ``cols`` matrix, iterated on
    its wide form (``m`` the smaller side, ``n`` the larger): per step ``X X^T`` (2 m^2 n), its
    square (2 m^3) and the product with ``X`` (2 m^2 n)."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m**3)


def exchange_elements(shapes: list[tuple[int, int]], world: int) -> list[int]:
    """The fp32 elements each rank receives (and, as many, sends) in one step's
    :func:`exchange` of matrices of ``shapes`` (numbered in order) over ``world`` ranks."""
    received = [0] * world
    for i, (rows, cols) in enumerate(shapes):
        padded = row_shards(rows, world)[0] * cols
        for rank in range(world):
            received[rank] += (world - 1) * padded if i % world == rank else padded
    return received


def state_elements_less_than_adamw(
    shapes: list[tuple[int, int]], world: int, row_norm: bool = False
) -> int:
    """How many fewer fp32 state elements rank 0 holds under Muon than under AdamW for the
    matrices of ``shapes``: Muon keeps one moment (momentum) where AdamW keeps two and a step
    count, NorMuon adds each row's second moment (one element a row); rows sharded as FSDP2
    shards them (rank 0's share is the largest, ``row_shards``)."""
    rows_here = [row_shards(rows, world)[0] for rows, _ in shapes]
    saved = sum(r * cols for r, (_, cols) in zip(rows_here, shapes, strict=True)) + len(shapes)
    return saved - (sum(rows_here) if row_norm else 0)


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
        row_beta2: float | None = None,
    ) -> None:
        """``row_beta2``: NorMuon's rows' normalization with that decay (None: Muon)."""
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            row_beta2=row_beta2,
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
        # the matrices' numbers run on in the groups' order, the same on every rank (a matrix
        # without a gradient keeps its number): which rank orthogonalizes which matrix
        steps = []
        owned = _orthogonal_shards(list(updates), [i for i, _ in indexed])
        if group["row_beta2"] is not None:  # NorMuon
            owned = [
                self._normalize_rows(p, o, group["row_beta2"])
                for p, o in zip(params, owned, strict=True)
            ]
        for (_, p), step in zip(indexed, owned, strict=True):
            rows, cols = p.shape
            scale = max(1.0, rows / cols) ** 0.5
            steps.append(step.mul_(-group["lr"] * scale))
        torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_add_(params, steps)

    def _normalize_rows(self, p: torch.Tensor, update: torch.Tensor, beta2: float) -> torch.Tensor:
        """NorMuon: ``update`` (orthogonalized) divided by the square root of each row's
        running mean square (``s <- beta2 s + (1 - beta2) mean_j(update_ij^2)``, not bias
        corrected, + 1e-10), then scaled back to its Frobenius norm. Rows are whole on their
        rank under FSDP2 (row shards), so only the two norms are reduced over ranks."""
        state = self.state[p]
        if "row_second_moment" not in state:
            state["row_second_moment"] = torch.zeros_like(p[:, :1])
        moment = state["row_second_moment"]
        moment.lerp_((update * update).mean(dim=1, keepdim=True), 1 - beta2)
        before = update.norm()
        normalized = update / (moment.sqrt() + 1e-10)
        return normalized * (before / (normalized.norm() + 1e-10))

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


def row_shards(rows: int, world: int) -> list[int]:
    """The rows of each rank's shard of a matrix split over ``world`` ranks on dimension 0, as
    DTensor's ``Shard(0)`` splits it (``torch.chunk``'s rule: ceil(rows / world) each, the last
    ranks fewer or none)."""
    size = -(-rows // world)
    return [max(0, min(size, rows - r * size)) for r in range(world)]


def exchange(updates: list[DTensor], indices: list[int]) -> list[torch.Tensor]:
    """``orthogonalize`` of each whole matrix, returned as each rank's own rows, for FSDP2's
    row-sharded matrices: the matrix numbered ``i`` (``indices``: the same numbers on every rank)
    is gathered only to rank ``i % world`` (each rank sends
    its rows), orthogonalized there, and each rank's rows of the result scattered back. Shards
    are padded to the largest shard's rows, as gloo's and NCCL's gather and scatter want equal
    sizes; every gather of the step is in flight at once, then every scatter.

    Per step a rank sends its rows of every matrix it does not own and receives the other
    ranks' rows of those it does, then the reverse: with the matrices spread evenly, about
    ``2 P (W - 1) / W^2`` elements each way, where ``P`` is the Muon matrices' elements and
    ``W`` the world size (against ``2 P`` received per rank when each rank gathered every matrix
    whole and the owner broadcast it)."""
    group = updates[0].device_mesh.get_group()
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    owners = [i % world for i in indices]
    padded, received, pending = [], [], []
    for update, owner in zip(updates, owners, strict=True):
        rows, cols = update.shape
        local = update.to_local().float()
        shard = torch.zeros(
            row_shards(rows, world)[0], cols, dtype=torch.float32, device=local.device
        )
        shard[: local.size(0)] = local
        gathered = [torch.empty_like(shard) for _ in range(world)] if rank == owner else None
        dst = dist.get_global_rank(group, owner)
        pending.append(dist.gather(shard, gathered, dst=dst, group=group, async_op=True))
        padded.append(gathered)
    for work in pending:
        work.wait()
    pending = []
    for update, owner, gathered in zip(updates, owners, padded, strict=True):
        rows, cols = update.shape
        sizes = row_shards(rows, world)
        local = update.to_local()
        out = torch.empty(sizes[0], cols, dtype=torch.float32, device=local.device)
        pieces = None
        if rank == owner:
            whole = torch.cat([piece[:n] for piece, n in zip(gathered, sizes, strict=True)])
            result = orthogonalize(whole)
            pieces = [torch.zeros_like(out) for _ in range(world)]
            for piece, chunk in zip(pieces, result.split(sizes), strict=True):
                piece[: chunk.size(0)] = chunk
        src = dist.get_global_rank(group, owner)
        pending.append(dist.scatter(out, pieces, src=src, group=group, async_op=True))
        received.append((out, sizes[rank], update.dtype))
    for work in pending:
        work.wait()
    return [out[:n].to(dtype) for out, n, dtype in received]


def _orthogonal_shards(updates: list[torch.Tensor], indices: list[int]) -> list[torch.Tensor]:
    """Each update's orthogonalized step, in the update's own layout: a plain tensor (one
    process, DDP: every rank has the whole gradient) computed where it is; FSDP2's row-sharded
    DTensors through :func:`exchange`, handed back as DTensors of the same shards."""
    if not updates or not isinstance(updates[0], DTensor):
        return [orthogonalize(u).to(u.dtype) for u in updates]
    if any(tuple(u.placements) != (Shard(0),) for u in updates):
        raise ValueError(
            f"Muon shards matrices by rows (FSDP2's Shard(0)), got {updates[0].placements}"
        )
    locals_ = exchange(updates, indices)
    return [
        DTensor.from_local(
            local, u.device_mesh, u.placements, run_check=False, shape=u.shape, stride=u.stride()
        )
        for local, u in zip(locals_, updates, strict=True)
    ]
