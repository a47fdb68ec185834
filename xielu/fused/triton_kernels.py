"""Triton kernels for the piecewise quadratic family (xIELU, xIPReLU) on CUDA tensors.

One pass each way. The forward reads x and writes y. The backward reads grad and x, writes dx and
one partial sum per program for each alpha gradient; the partials are then added by ``torch.sum``
in a fixed order, so the alpha gradients are deterministic (no atomics) run to run.

The kernels are plain ``tl`` arithmetic with no libdevice calls, so Triton's interpreter
(``TRITON_INTERPRET=1``) runs them on CPU tensors, which is how they are tested without a GPU.
Math is fp32 whatever the storage dtype (bf16, fp16, fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_SIZE = 2048
NUM_WARPS = 8
_KINDS = {"xielu": 0, "xiprelu": 1}


@triton.jit
def _expm1(x):
    # exp(x) - 1 cancels catastrophically near 0 (paper, section 3.4), and approximate
    # exp/log instructions make Kahan's log-based correction inaccurate on GPUs. Below -1/2 the
    # subtraction is harmless; above it a degree-10 Taylor polynomial is exact to fp32 rounding
    # (its truncation error at |x| = 1/2 is 1e-11 relative).
    p = 1.0 / 3628800.0
    p = p * x + 1.0 / 362880.0
    p = p * x + 1.0 / 40320.0
    p = p * x + 1.0 / 5040.0
    p = p * x + 1.0 / 720.0
    p = p * x + 1.0 / 120.0
    p = p * x + 1.0 / 24.0
    p = p * x + 1.0 / 6.0
    p = p * x + 0.5
    p = p * x + 1.0
    small = p * x
    return tl.where(x > -0.5, small, tl.exp(x) - 1.0)


@triton.jit
def _forward_kernel(
    x_ptr,
    y_ptr,
    alpha_p_ptr,
    alpha_n_ptr,
    n_elements,
    beta,
    eps,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # Alphas are read from device memory so that no host synchronisation is needed.
    ap = tl.load(alpha_p_ptr).to(tl.float32)
    an = tl.load(alpha_n_ptr).to(tl.float32)
    positive = (ap * x + beta) * x
    if KIND == 0:
        negative = an * (_expm1(tl.minimum(x, eps)) - x) + beta * x
    else:
        negative = (an * x + beta) * x
    y = tl.where(x > 0, positive, negative)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(
    grad_ptr,
    x_ptr,
    dx_ptr,
    partial_p_ptr,
    partial_n_ptr,
    alpha_p_ptr,
    alpha_n_ptr,
    n_elements,
    beta,
    eps,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    ap = tl.load(alpha_p_ptr).to(tl.float32)
    an = tl.load(alpha_n_ptr).to(tl.float32)
    positive = x > 0
    square = x * x
    if KIND == 0:
        em1 = _expm1(tl.minimum(x, eps))
        # clamp passes the gradient at x == eps itself, like torch's autograd of clamp(max=eps);
        # "not above eps" also sends a NaN input to a NaN slope, as in formulas.py
        slope_n = an * (tl.where(x > eps, 0.0, em1 + 1.0) - 1.0) + beta
        integral_n = em1 - x
    else:
        slope_n = 2.0 * an * x + beta
        integral_n = square
    slope = tl.where(positive, 2.0 * ap * x + beta, slope_n)
    tl.store(dx_ptr + offsets, (g * slope).to(dx_ptr.dtype.element_ty), mask=mask)
    # Masked lanes loaded x = g = 0, so they add exactly 0 to both sums.
    tl.store(partial_p_ptr + pid, tl.sum(tl.where(positive, g * square, 0.0), axis=0))
    tl.store(partial_n_ptr + pid, tl.sum(tl.where(positive, 0.0, g * integral_n), axis=0))


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK_SIZE),)


def forward(
    x: Tensor, alpha_p: Tensor, alpha_n: Tensor, beta: float, eps: float, kind: str
) -> Tensor:
    # Kernels index a flat, contiguous buffer; a strided input is copied once here.
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _forward_kernel[_grid(n)](
            x,
            y,
            alpha_p,
            alpha_n,
            n,
            beta,
            eps,
            KIND=_KINDS[kind],
            BLOCK=BLOCK_SIZE,
            num_warps=NUM_WARPS,
        )
    return y


def backward(
    grad: Tensor, x: Tensor, alpha_p: Tensor, alpha_n: Tensor, beta: float, eps: float, kind: str
) -> tuple[Tensor, Tensor, Tensor]:
    x = x.contiguous()
    grad = grad.contiguous()
    dx = torch.empty_like(x)
    n = x.numel()
    programs = triton.cdiv(n, BLOCK_SIZE)
    partials = torch.zeros(2, max(programs, 1), device=x.device, dtype=torch.float32)
    if n:
        _backward_kernel[(programs,)](
            grad,
            x,
            dx,
            partials[0],
            partials[1],
            alpha_p,
            alpha_n,
            n,
            beta,
            eps,
            KIND=_KINDS[kind],
            BLOCK=BLOCK_SIZE,
            num_warps=NUM_WARPS,
        )
    # two separate reductions: custom ops may not return views of one another
    d_alpha_p = partials[0].sum().reshape(1).to(alpha_p.dtype)
    d_alpha_n = partials[1].sum().reshape(1).to(alpha_n.dtype)
    return dx, d_alpha_p, d_alpha_n
