"""The optimizer: its section (``optim``), the table of optimizers, and the parameter groups
every optimizer shares, with weight decay only where it makes sense, decided by parameter role.

Adding an optimizer is its module and its line in :data:`OPTIMIZERS` (docs/extending.md): the
module's ``build(groups, optim, device)`` makes it from :func:`parameter_groups` and the
``optim`` section; an optimizer with knobs of its own gives them a section dataclass in its
module and a field of :class:`OptimConfig` named after it (``optim.ademamix.*``,
``optim.muon.*``). The checks, the trainer, the reports and the sweeps ask this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from settings import ConfigError, Run, Section, at_least, one_of, positive
from training import ademamix, muon
from training.ademamix import AdEMAMixConfig
from training.muon import MuonConfig, NorMuonConfig
from training.parameter_groups import parameter_groups


def build_adamw(groups: list[dict], optim: OptimConfig, device: torch.device):
    """torch's AdamW, fused on CUDA and foreach elsewhere (``optim.fused`` decides when set)."""
    fused = optim.fused if optim.fused is not None else device.type == "cuda"
    return torch.optim.AdamW(
        groups,
        lr=optim.lr,
        betas=tuple(optim.betas),
        eps=optim.eps,
        fused=fused or None,
        foreach=None if fused else True,
    )


@dataclass(frozen=True)
class Optimizer:
    """A line of :data:`OPTIMIZERS`.

    Attributes:
        build: ``(groups, optim, device) -> torch.optim.Optimizer``.
        summary: one line for listings and docs.
        matrix_rate: the field of its own section that is the hidden matrices' peak rate
            (Muon: ``lr``, so ``optim.muon.lr``), when it trains them at a rate of their own:
            :func:`parameter_groups` puts them in a group of their own (``muon: True``), and
            that key is the rate its sweeps tune; None: every group at ``optim.lr``.
        fused: it has a fused kernel, so ``optim.fused=true`` is not refused.
    """

    build: Callable[[list[dict], Any, torch.device], torch.optim.Optimizer]
    summary: str
    matrix_rate: str | None = None
    fused: bool = False


OPTIMIZERS: dict[str, Optimizer] = {
    "adamw": Optimizer(build_adamw, "AdamW (the paper)", fused=True),
    "ademamix": Optimizer(ademamix.build, "AdEMAMix: Adam plus a slow average (Apertus)"),
    "muon": Optimizer(muon.build, "Muon for the hidden matrices, AdamW for the rest", "lr"),
    "normuon": Optimizer(muon.build_normuon, "NorMuon: Muon with rows normalized, AdamW", "lr"),
}


def register_optimizer(name: str, optimizer: Optimizer) -> None:
    """Add an optimizer outside the table (an experiment's own, registered before the config
    is composed); the table is the place for a shipped one."""
    if name in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is registered twice")
    OPTIMIZERS[name] = optimizer


@dataclass
class OptimConfig(Section):
    """``optim``: the optimizer and the settings every optimizer shares; each optimizer's own
    knobs in its subsection (``optim.ademamix``, ``optim.muon``), read only under its name.

    AdamW (paper: betas 0.9/0.95, eps 1e-8, weight decay 0.1 main / 0.01 ablations), AdEMAMix
    (``training/ademamix.py``) or Muon with AdamW (``training/muon.py``).

    Attributes:
        name: a line of :data:`OPTIMIZERS`: ``adamw`` (the paper), ``ademamix``, ``muon``
            (Muon for the attention and MLP matrices at ``optim.muon.lr``, AdamW for every
            other parameter at ``lr``, both on the schedule's shape) or ``normuon`` (the same
            with NorMuon's rows' normalization, at ``optim.normuon.lr``). ``lr``, ``betas`` (beta1,
            beta2), ``eps``, the weight decay and its roles, the scalar multiplier and µP's
            per-group rates mean the same under each. A resume may not change it.
        lr: peak learning rate.
        min_lr: the learning rate the schedule decays to.
        weight_decay: decoupled weight decay of the decayed groups.
        decay_norms_and_embeddings: apply weight decay to norm weights and the embedding too
            (default off: decay on scale parameters pulls them to zero for no benefit).
        decay_activation_scalars: apply weight decay to alpha_p / alpha_n / trainable beta
            (default off, as in the Megatron xIELU runs: decay would pull the softplus-raw
            alphas towards softplus(0) = 0.69 rather than towards "no activation").
        scalar_lr_multiplier: the activation scalars' learning rate over the schedule's (1: the
            paper). Adam moves a scalar by about lr per step, so a short run (the CPU study
            sums ~1 of lr over its steps, the paper's 1.1B ~47) leaves the alphas near their
            initialisation; a multiplier lets them reach their regime in fewer steps.
        grad_clip: global gradient-norm clip; 0 disables; negative values are refused.
        fused: torch's fused AdamW kernel (CUDA and CPU); ``None`` picks it on CUDA.
    """

    name: str = "adamw"
    lr: float = 3e-3
    min_lr: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_norms_and_embeddings: bool = False
    decay_activation_scalars: bool = False
    scalar_lr_multiplier: float = 1.0
    grad_clip: float = 1.0
    fused: bool | None = None
    ademamix: AdEMAMixConfig = field(default_factory=AdEMAMixConfig)
    muon: MuonConfig = field(default_factory=MuonConfig)
    normuon: NorMuonConfig = field(default_factory=NorMuonConfig)

    def check(self, run: Run | None = None) -> None:
        one_of("optim.name", self.name, OPTIMIZERS)
        positive("optim.lr", self.lr, "0 trains nothing")
        positive("optim.eps", self.eps, "Adam divides by sqrt(v) + eps")
        positive("optim.scalar_lr_multiplier", self.scalar_lr_multiplier)
        at_least("optim.weight_decay", self.weight_decay, 0)
        at_least(
            "optim.grad_clip",
            self.grad_clip,
            0,
            "0: no clipping; a negative clip climbs the gradient",
        )
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"optim.min_lr={self.min_lr} must lie in [0, optim.lr={self.lr}]")
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):
            raise ConfigError(f"optim.betas={list(self.betas)} must be two values in [0, 1)")
        if self.fused and not OPTIMIZERS[self.name].fused:
            raise ConfigError(f"optim.fused=true: optim.name={self.name} has no fused kernel")
        for key, rate in self.decayed_rates():
            if rate * self.weight_decay >= 1:
                raise ConfigError(
                    f"optim.weight_decay={self.weight_decay:g} x {key}={rate:g} = "
                    f"{rate * self.weight_decay:g}: each step would multiply those weights by "
                    f"{1 - rate * self.weight_decay:g}, zeroing or flipping them; the product "
                    "must stay below 1 (0.1 x 1e-3 is usual)"
                )

    @property
    def matrix_rate(self) -> tuple[str, float] | None:
        """(key, peak rate) of the hidden matrices under an optimizer that trains them at a
        rate of their own (``optim.muon.lr``), else None."""
        name = OPTIMIZERS[self.name].matrix_rate
        if name is None:
            return None
        return f"optim.{self.name}.{name}", getattr(getattr(self, self.name), name)

    @property
    def tuned_rate(self) -> str:
        """The setting a rate sweep of this optimizer varies and a µP ladder carries from its
        tuning sweep (``eval/tuning.py``): the matrices' own rate where the optimizer has one
        (``optim.muon.lr``: nearly every parameter), ``optim.lr`` otherwise."""
        return self.matrix_rate[0] if self.matrix_rate else "optim.lr"

    @property
    def rate_keys(self) -> list[str]:
        """The settings a run that diverges should lower, for its stop message."""
        if self.matrix_rate is None:
            return ["optim.lr"]
        return [f"{self.matrix_rate[0]} ({self.name.capitalize()}'s matrices)", "optim.lr"]

    def decayed_rates(self) -> list[tuple[str, float]]:
        """(what names it, peak rate) of each parameter group weight decay applies to:
        decoupled decay multiplies those weights by 1 - rate x weight_decay every step
        (:func:`parameter_groups`; µP's hidden group divides the rate and multiplies the decay
        by the same factor)."""
        rates = [("optim.lr", self.lr)]
        if self.matrix_rate is not None:
            rates.append(self.matrix_rate)
        if self.decay_activation_scalars:
            rates.append(
                ("optim.lr x optim.scalar_lr_multiplier", self.lr * self.scalar_lr_multiplier)
            )
        return rates


def build_optimizer(
    model: nn.Module, config: OptimConfig, device: torch.device
) -> torch.optim.Optimizer:
    """``optim.name``'s optimizer (:data:`OPTIMIZERS`) over :func:`parameter_groups`."""
    return OPTIMIZERS[config.name].build(parameter_groups(model, config), config, device)
