"""Forward and one-pass backward of the piecewise quadratic family, in plain torch ops.

xIELU and xIPReLU share the positive branch ``alpha_p * x² + beta * x`` and differ below zero:

    xIELU   (paper eq. 8):  alpha_n * (expm1(min(x, eps)) - x) + beta * x
    xIPReLU (paper eq. 18): alpha_n * x² + beta * x

These functions take the *effective* alphas (after softplus) and are the single source of the
formulas for the eager and compiled CPU paths; the Triton kernels transcribe them. The backward
returns dx and the two alpha gradients, which is everything the custom op needs to save just x.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from xielu.design import compute_dtype

NegativeBranch = Literal["xielu", "xiprelu"]


def piecewise_forward(
    x: Tensor, alpha_p: Tensor, alpha_n: Tensor, beta: float, eps: float, kind: NegativeBranch
) -> Tensor:
    xf = x.to(compute_dtype(x.dtype))
    ap = alpha_p.to(xf.dtype)
    an = alpha_n.to(xf.dtype)
    positive = (ap * xf + beta) * xf
    if kind == "xielu":
        # Capping the exponent at eps keeps expm1 finite for large x in the branch that
        # torch.where discards; it is also the paper's definition of xIELU in (eps, 0].
        negative = an * (torch.expm1(xf.clamp(max=eps)) - xf) + beta * xf
    else:
        negative = (an * xf + beta) * xf
    return torch.where(xf > 0, positive, negative).to(x.dtype)


def piecewise_backward(
    grad: Tensor,
    x: Tensor,
    alpha_p: Tensor,
    alpha_n: Tensor,
    beta: float,
    eps: float,
    kind: NegativeBranch,
) -> tuple[Tensor, Tensor, Tensor]:
    """dx, d(alpha_p), d(alpha_n): the gradients autograd gives for :func:`piecewise_forward`.

    Below eps xIELU's slope is alpha_n * expm1(x) + beta; in (eps, 0] the capped expm1 term is
    constant, so the slope is beta - alpha_n (autograd of clamp passes the gradient at x = eps
    itself). Alpha gradients are accumulated in fp32 (or fp64 for fp64 input). The one deliberate
    difference from autograd: a NaN input gets a NaN dx.
    """
    cdt = compute_dtype(x.dtype)
    xf = x.to(cdt)
    gf = grad.to(cdt)
    ap = alpha_p.to(cdt)
    an = alpha_n.to(cdt)
    positive = xf > 0
    square = xf * xf
    if kind == "xielu":
        em1 = torch.expm1(xf.clamp(max=eps))
        # written as "not above eps" so that a NaN input gets a NaN slope (autograd of the
        # formula would give beta - alpha_n there and hide the NaN from dx)
        slope_n = an * (torch.where(xf > eps, 0.0, em1 + 1) - 1) + beta
        integral_n = em1 - xf
    else:
        slope_n = 2 * an * xf + beta
        integral_n = square
    slope = torch.where(positive, 2 * ap * xf + beta, slope_n)
    dx = (gf * slope).to(x.dtype)
    d_alpha_p = torch.where(positive, gf * square, 0.0).sum().reshape(1)
    d_alpha_n = torch.where(positive, 0.0, gf * integral_n).sum().reshape(1)
    return dx, d_alpha_p.to(alpha_p.dtype), d_alpha_n.to(alpha_n.dtype)
