"""AdEMAMix (Pagliardini, Ablin, Grangier 2024): Adam plus a slow gradient average, mixed in.

Adam's one average of past gradients (beta1 = 0.9) forgets in about ten steps; AdEMAMix adds a
second, slow one (beta3 = 0.9999: a half-life of about 7,000 steps) and moves by their sum,

    m1 <- beta1 m1 + (1 - beta1) g          (bias-corrected, as Adam's)
    m2 <- beta3(t) m2 + (1 - beta3(t)) g    (not bias-corrected)
    v  <- beta2 v + (1 - beta2) g^2         (bias-corrected)
    p  <- p - lr (m1_hat + alpha(t) m2) / (sqrt(v_hat) + eps) - lr wd p

with t the update's number (1 for the first). Early in a run the slow average holds a few
large gradients of a random model; both warmups keep it from dominating then (the paper's
section 3): ``alpha(t)`` rises linearly from 0 to ``alpha`` over ``alpha_warmup`` steps, and
``beta3(t)`` rises from ``beta1`` to ``beta3`` with its half-life, ln(0.5) / ln(beta3(t)),
growing linearly over ``beta3_warmup`` steps, which in closed form is

    beta3(t) = exp(ln(beta1) ln(beta3) / ((1 - t/T) ln(beta3) + (t/T) ln(beta1))),  t < T.

A warmup of 0 means none (the final value from the first step). Weight decay is decoupled,
AdamW's: ``p <- p (1 - lr wd)``.

Why not a library's: pytorch-optimizer's ``AdEMAMix`` and the authors' reference loop over
parameters one at a time and keep the step count as a Python int; here the update runs on
lists (``torch._foreach_*``), which DTensor shards (FSDP2) support as AdamW's foreach path
does, and the step count is a tensor in each parameter's state, so distributed checkpoints
save, reshard and restore it with the moments.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from settings import Run, Section, at_least, fraction


@dataclass
class AdEMAMixConfig(Section):
    """``optim.ademamix``: the knobs AdEMAMix adds to Adam's (the Apertus models: betas
    0.9/0.999, alpha 8, beta3 0.9999, both warmups 100,000 steps).

    Attributes:
        alpha: the weight on the slow average (Apertus: 8).
        beta3: the slow average's decay (Apertus: 0.9999, a half-life of ~6,900 steps; a run
            should be several half-lives long for it to matter).
        alpha_warmup: steps over which alpha rises linearly from 0 (0: none).
        beta3_warmup: steps over which beta3 rises from beta1 with its half-life growing
            linearly (0: none).
    """

    alpha: float = 8.0
    beta3: float = 0.9999
    alpha_warmup: int = 0
    beta3_warmup: int = 0

    def check(self, run: Run | None = None) -> None:
        at_least("optim.ademamix.alpha", self.alpha, 0)
        fraction("optim.ademamix.beta3", self.beta3)
        at_least("optim.ademamix.alpha_warmup", self.alpha_warmup, 0)
        at_least("optim.ademamix.beta3_warmup", self.beta3_warmup, 0)


def build(groups: list[dict], optim: Any, device: torch.device) -> AdEMAMix:
    """``optim.name=ademamix`` (``training.optim.OPTIMIZERS``): its foreach path, every group."""
    a = optim.ademamix
    return AdEMAMix(
        groups,
        lr=optim.lr,
        betas=(*optim.betas, a.beta3),
        alpha=a.alpha,
        alpha_warmup=a.alpha_warmup,
        beta3_warmup=a.beta3_warmup,
        eps=optim.eps,
    )


def alpha_at(step: int, alpha: float, warmup: int) -> float:
    """The mixing coefficient at update ``step`` (1-based): linear from 0 over ``warmup``."""
    if warmup and step < warmup:
        return alpha * step / warmup
    return alpha


def beta3_at(step: int, beta1: float, beta3: float, warmup: int) -> float:
    """The slow average's decay at update ``step``: from ``beta1`` to ``beta3`` with the
    half-life growing linearly over ``warmup`` steps (module docstring)."""
    if not warmup or step >= warmup:
        return beta3
    a = step / warmup
    if beta1 == 0.0:  # a half-life of 0 to start: the closed form's limit, beta3^(1/a)
        return min(beta3 ** (1 / a), beta3) if a else 0.0
    log_start, log_end = math.log(beta1), math.log(beta3)
    return min(math.exp(log_start * log_end / ((1 - a) * log_end + a * log_start)), beta3)


class AdEMAMix(torch.optim.Optimizer):
    """AdEMAMix with its alpha and beta3 warmups; ``betas`` are (beta1, beta2, beta3).

    Per parameter the state is ``step`` (a float tensor, as AdamW's), ``exp_avg`` (m1),
    ``exp_avg_slow`` (m2) and ``exp_avg_sq`` (v): one moment more than AdamW, a third more
    optimizer memory. Parameters without a gradient are left alone, as AdamW leaves them.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 8.0,
        alpha_warmup: int = 0,
        beta3_warmup: int = 0,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or alpha < 0:
            raise ValueError(
                f"AdEMAMix needs lr, eps, weight_decay and alpha >= 0, got {lr}, {eps}, "
                f"{weight_decay}, {alpha}"
            )
        if len(betas) != 3 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"AdEMAMix needs three betas in [0, 1), got {betas}")
        if alpha_warmup < 0 or beta3_warmup < 0:
            raise ValueError(
                f"AdEMAMix's warmups must be >= 0, got {alpha_warmup} and {beta3_warmup}"
            )
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            alpha=alpha,
            alpha_warmup=alpha_warmup,
            beta3_warmup=beta3_warmup,
            eps=eps,
            weight_decay=weight_decay,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # parameters that have taken the same number of updates move together
            by_step: dict[int, list[Tensor]] = defaultdict(list)
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("AdEMAMix does not support sparse gradients")
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    for key in ("exp_avg", "exp_avg_slow", "exp_avg_sq"):
                        state[key] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["step"] += 1
                by_step[int(state["step"].item())].append(param)
            for step, params in by_step.items():
                self._update(group, params, step)
        return loss

    def _update(self, group: dict, params: list[Tensor], step: int) -> None:
        beta1, beta2, beta3_final = group["betas"]
        beta3 = beta3_at(step, beta1, beta3_final, group["beta3_warmup"])
        alpha = alpha_at(step, group["alpha"], group["alpha_warmup"])
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        states = [self.state[p] for p in params]
        grads = [p.grad for p in params]
        fast = [s["exp_avg"] for s in states]
        slow = [s["exp_avg_slow"] for s in states]
        square = [s["exp_avg_sq"] for s in states]

        torch._foreach_lerp_(fast, grads, 1 - beta1)
        torch._foreach_lerp_(slow, grads, 1 - beta3)
        torch._foreach_mul_(square, beta2)
        torch._foreach_addcmul_(square, grads, grads, 1 - beta2)
        if decay:
            torch._foreach_mul_(params, 1 - lr * decay)

        denominator = torch._foreach_sqrt(square)
        torch._foreach_div_(denominator, math.sqrt(1 - beta2**step))
        torch._foreach_add_(denominator, eps)
        numerator = torch._foreach_mul(slow, alpha)
        torch._foreach_add_(numerator, fast, alpha=1 / (1 - beta1**step))
        torch._foreach_div_(numerator, denominator)
        torch._foreach_add_(params, numerator, alpha=-lr)
