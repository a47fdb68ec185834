"""How a trainable scalar alpha is stored: a raw parameter mapped to the effective value.

The paper constrains its alphas with softplus (section 3.3): alpha_p > 0 keeps the positive
gradient increasing, alpha_n > beta guarantees negative-valued gradients below zero. The raw,
unconstrained value is what the optimiser sees and what checkpoints store; the effective value is
what the formulas use and what we log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Constraint = Literal["softplus", "affine", "fixed"]


def inverse_softplus(y: float) -> float:
    """The x with softplus(x) = y, computed stably: log(expm1(y)) = y + log(-expm1(-y))."""
    if y <= 0:
        raise ValueError(f"softplus only reaches positive values; cannot invert {y}")
    return y + math.log(-math.expm1(-y))


@dataclass(frozen=True)
class Alpha:
    """A branch's gradient scale alpha and how it is constrained.

    ``init`` is the *effective* value at initialisation (the paper's 0.8), whatever the constraint.

    - ``softplus``: alpha = floor + softplus(raw), floor = ``offset`` (+ beta when ``above_beta``).
      ``above_beta`` is xIELU's alpha_n > beta_n; with a trainable beta the floor moves with it.
    - ``affine``: alpha = offset + scale * raw, unconstrained (xSiLU: 1 + 2 * alpha).
    - ``fixed``: a constant, no parameter (SiLU's or ReLU²'s gradient has no trainable scale).
    """

    init: float
    constraint: Constraint = "softplus"
    offset: float = 0.0
    scale: float = 1.0
    above_beta: bool = False

    def __post_init__(self) -> None:
        if self.constraint not in ("softplus", "affine", "fixed"):
            raise ValueError(
                f"alpha constraint {self.constraint!r} is not known; "
                "choose one of: softplus, affine, fixed"
            )
        if self.constraint == "affine" and self.scale == 0:
            raise ValueError("an affine alpha needs a non-zero scale")
        if self.above_beta and self.constraint != "softplus":
            raise ValueError("above_beta only makes sense with the softplus constraint")

    @property
    def trainable(self) -> bool:
        return self.constraint != "fixed"

    def floor(self, beta: float) -> float:
        return self.offset + (beta if self.above_beta else 0.0)

    def raw_init(self, beta: float) -> float:
        """The raw parameter value whose effective alpha equals ``init``."""
        if self.constraint == "softplus":
            floor = self.floor(beta)
            if self.init <= floor:
                raise ValueError(
                    f"alpha init {self.init} must exceed its softplus floor {floor} "
                    "(offset, plus beta when alpha is constrained above beta)"
                )
            return inverse_softplus(self.init - floor)
        if self.constraint == "affine":
            return (self.init - self.offset) / self.scale
        return self.init

    def effective(
        self, raw: torch.Tensor | None, beta: torch.Tensor | float
    ) -> torch.Tensor | float:
        """Map the raw parameter to alpha; differentiable in ``raw`` and in a trainable beta."""
        if self.constraint == "fixed" or raw is None:
            return self.init
        if self.constraint == "affine":
            return self.offset + self.scale * raw
        alpha = F.softplus(raw) + self.offset
        return alpha + beta if self.above_beta else alpha
