"""The paper's appendix implementations, transcribed as plain autograd code.

These are the *unfused reference*: what the authors trained with (relying on torch.compile). They
serve as the baseline in ``scripts/bench/activations.py`` and as an independent check of the
library's formulas in the tests. Scalars are 1-element tensors, alphas enter through softplus.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from xielu.parametrize import inverse_softplus


def xielu_reference(
    x: Tensor, alpha_p_raw: Tensor, alpha_n_raw: Tensor, beta: float = 0.5, eps: float = -1e-6
) -> Tensor:
    """Appendix A.3: xIELU with alpha_p = softplus(a_p), alpha_n = beta + softplus(a_n)."""
    alpha_p = F.softplus(alpha_p_raw)
    alpha_n = beta + F.softplus(alpha_n_raw)
    eps_t = torch.tensor(eps, dtype=x.dtype, device=x.device)
    return torch.where(
        x > 0,
        alpha_p * x * x + beta * x,
        alpha_n * torch.expm1(torch.min(x, eps_t)) - alpha_n * x + beta * x,
    )


def xiprelu_reference(
    x: Tensor, alpha_p_raw: Tensor, alpha_n_raw: Tensor, beta: float = 0.5
) -> Tensor:
    """Appendix A.6: xIPReLU with alpha_p, alpha_n = softplus(.)."""
    alpha_p = F.softplus(alpha_p_raw)
    alpha_n = F.softplus(alpha_n_raw)
    return torch.where(x > 0, alpha_p * x * x + beta * x, alpha_n * x * x + beta * x)


class ReferenceXIELU(torch.nn.Module):
    """The appendix module, parameters stored as in :class:`xielu.XIELU` (shape [1])."""

    def __init__(
        self,
        alpha_p_init: float = 0.8,
        alpha_n_init: float = 0.8,
        beta: float = 0.5,
        eps: float = -1e-6,
    ) -> None:
        super().__init__()
        self.beta, self.eps = beta, eps
        self.alpha_p = torch.nn.Parameter(torch.tensor([inverse_softplus(alpha_p_init)]))
        self.alpha_n = torch.nn.Parameter(torch.tensor([inverse_softplus(alpha_n_init - beta)]))

    def forward(self, x: Tensor) -> Tensor:
        return xielu_reference(x, self.alpha_p, self.alpha_n, self.beta, self.eps)
