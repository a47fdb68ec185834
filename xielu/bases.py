"""Base gradients g (with antiderivatives G) from which the paper's activations are integrated.

Each returns a :class:`~xielu.design.BaseGradient`. ``G`` is written in the numerically stable
form the forward pass should evaluate; ``g`` is the closed-form derivative, kept independent of
``G`` so that the tests can check one against the other.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from xielu.design import BaseGradient

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


def linear() -> BaseGradient:
    """g = 2x, G = x²: ReLU²'s gradient shape; xIELU's positive and xIPReLU's negative branch.

    The factor 2 is the paper's (eq. 6): it makes the integral alpha * x².
    """
    return BaseGradient("2x", g=lambda x: 2 * x, G=lambda x: x * x)


def quadratic() -> BaseGradient:
    """g = 3x², G = x³: the ablation "positive component x³"."""
    return BaseGradient("3x^2", g=lambda x: 3 * x * x, G=lambda x: x * x * x)


def zero() -> BaseGradient:
    """g = 0: a branch whose slope is the constant beta alone (ReLU's, or 0 for ReLU² below 0)."""
    return BaseGradient("0", g=torch.zeros_like, G=torch.zeros_like)


def elu(eps: float = -1e-6) -> BaseGradient:
    """g = e^x - 1 (ELU below zero, shifted to 0 at the origin), G = e^x - x - 1.

    ``expm1`` avoids the cancellation of e^x - 1 near zero (paper, section 3.4). Its argument is
    capped at ``eps`` as in the paper's reference code; in (eps, 0] the expm1 term is then
    constant, which is how xIELU is defined in practice (and why its autograd gradient there is
    beta - alpha rather than the designed beta). The integration constant stays the exact one,
    G(0) = 0, so f(0) = alpha * expm1(eps), within alpha * 1e-6 of zero, as in the paper.
    """

    def G(x: Tensor) -> Tensor:
        return torch.expm1(x.clamp(max=eps)) - x

    return BaseGradient(f"e^x-1 (eps={eps:g})", g=torch.expm1, G=G, G0=0.0)


def _silu_derivative(x: Tensor) -> Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def silu_centered() -> BaseGradient:
    """g = SiLU'(x) - 1/2, G = SiLU(x) - x/2.

    With alpha = 1 and beta = 1/2 this is SiLU; with alpha = 1 + 2a it is xSiLU(a) =
    x * (sigmoid(x) * (1 + 2a) - a), the expanded SiLU of Huang (2024): (1 + 2a) * SiLU' - a
    equals (1 + 2a) * (SiLU' - 1/2) + 1/2.
    """
    return BaseGradient(
        "SiLU'-1/2",
        g=lambda x: _silu_derivative(x) - 0.5,
        G=lambda x: x * torch.sigmoid(x) - 0.5 * x,
    )


def _gelu_exact(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))


def _gelu_exact_derivative(x: Tensor) -> Tensor:
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return cdf + x * pdf


def _gelu_tanh(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x**3)))


def _gelu_tanh_derivative(x: Tensor) -> Tensor:
    t = torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x**3))
    inner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_TANH_CUBIC * x * x)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * inner


def gelu_centered(approximate: str = "none") -> BaseGradient:
    """g = GELU'(x) - 1/2, G = GELU(x) - x/2 (exact erf form, or the tanh approximation)."""
    if approximate == "tanh":
        f, df = _gelu_tanh, _gelu_tanh_derivative
    elif approximate == "none":
        f, df = _gelu_exact, _gelu_exact_derivative
    else:
        raise ValueError(f"GELU approximate must be 'none' or 'tanh', not {approximate!r}")
    return BaseGradient(
        f"GELU'-1/2 ({approximate})", g=lambda x: df(x) - 0.5, G=lambda x: f(x) - 0.5 * x
    )
