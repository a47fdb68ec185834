"""Triton kernels for the piecewise quadratic family (xIELU, xIPReLU) on CUDA tensors.

One pass each way over the big tensors. The forward reads x and writes y. The backward reads
grad and x, writes dx and one partial sum per program for each alpha gradient; a second, tiny
kernel adds the partials in a fixed order into the two alpha gradients. No atomics, so the alpha
gradients are bit-identical run to run, which bit-exact resume needs.

Launch shapes come from :data:`CONFIGS` (per storage dtype), fixed rather than autotuned: the
backward's reduction order depends on the shape, and a timing-based choice could differ between
the run that wrote a checkpoint and the run that resumes it.
``python -m scripts.bench.tune_kernels`` measures the candidates on a GPU.

The kernels are plain ``tl`` arithmetic with no libdevice calls, so Triton's interpreter
(``TRITON_INTERPRET=1``) runs them on CPU tensors, which is how they are tested without a GPU.
Math is fp32 whatever the storage dtype (bf16, fp16, fp32). Offsets are 64-bit, so tensors
past 2^31 elements are addressed correctly; they are written in the canonical
``start + arange < n`` form, which Triton's alignment analysis turns into vector loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor


@dataclass(frozen=True)
class KernelConfig:
    """How the kernels are launched.

    Attributes:
        block: elements per program and loop step (a power of two).
        warps: warps per program.
        blocks_per_program: backward only: blocks one program walks through, summing the alpha
            gradients in registers, so that there is one cross-warp reduction and one partial
            per ``block * blocks_per_program`` elements.
    """

    block: int = 2048
    warps: int = 8
    blocks_per_program: int = 1

    def __post_init__(self) -> None:
        for name in ("block", "warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"KernelConfig.{name}={value} must be a power of two")
        if self.blocks_per_program < 1:
            raise ValueError(f"blocks_per_program={self.blocks_per_program} must be >= 1")


# bf16: `python -m scripts.bench.tune_kernels --dtypes bfloat16` on an H100 on 2026-11-27 (x1.04 of
# compiled ReLU² for xIELU, x1.02 for xIPReLU, against x1.16 at the default); float16 moves the
# same bytes and takes the same shape; float32 keeps the default until it is measured.
# `python -m scripts.bench.tune_kernels` prints the best candidates per dtype to put here.
CONFIGS: dict[torch.dtype, KernelConfig] = {
    torch.bfloat16: KernelConfig(block=2048, warps=4, blocks_per_program=16),
    torch.float16: KernelConfig(block=2048, warps=4, blocks_per_program=16),
    torch.float32: KernelConfig(),
}
# the kernels' KIND constant per activation
KINDS = {"xielu": 0, "xiprelu": 1}
# partial sums added per step of the final reduction
_REDUCE_BLOCK = 1024


def config_for(dtype: torch.dtype) -> KernelConfig:
    return CONFIGS.get(dtype, KernelConfig())


@triton.jit
def _expm1(x):
    # exp(x) - 1 cancels catastrophically near 0 (paper, section 3.4), and approximate
    # exp/log instructions make Kahan's log-based correction inaccurate on GPUs. Below -1/2 the
    # subtraction is harmless; above it a degree-9 Taylor polynomial is exact to fp32 rounding
    # (its truncation error at |x| = 1/2 is 7e-10 relative; evaluated in fp32 over [-1/2, 0) it
    # rounds exactly as degree 10 did, at most 1.3 ulp from float64, with one FMA less).
    p = 1.0 / 362880.0
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
def _cap(x, eps):
    # min(x, eps) that keeps a NaN: a GPU's plain min returns the other operand (IEEE minNum),
    # which would give a NaN input a finite slope; the NaN-propagating min costs the same.
    return tl.minimum(x, eps, propagate_nan=tl.PropagateNan.ALL)


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
    negative = an * (_expm1(_cap(x, eps)) - x) + beta * x if KIND == 0 else (an * x + beta) * x
    y = tl.where(x > 0, positive, negative)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(
    grad_ptr,
    x_ptr,
    dx_ptr,
    partials_ptr,
    n_programs,
    alpha_p_ptr,
    alpha_n_ptr,
    n_elements,
    beta,
    eps,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
):
    pid = tl.program_id(0)
    ap = tl.load(alpha_p_ptr).to(tl.float32)
    an = tl.load(alpha_n_ptr).to(tl.float32)
    sum_p = tl.zeros([BLOCK], dtype=tl.float32)
    sum_n = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(BLOCKS_PER_PROGRAM):
        block = pid.to(tl.int64) * BLOCKS_PER_PROGRAM + step
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        # past the end (the last program's spare steps) the mask is all false
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        positive = x > 0
        square = x * x
        if KIND == 0:
            em1 = _expm1(_cap(x, eps))
            # clamp passes the gradient at x == eps itself, like torch's autograd of
            # clamp(max=eps); "not above eps" also sends a NaN input to a NaN slope, as in
            # formulas.py
            slope_n = an * (tl.where(x > eps, 0.0, em1 + 1.0) - 1.0) + beta
            integral_n = em1 - x
        else:
            slope_n = 2.0 * an * x + beta
            integral_n = square
        slope = tl.where(positive, 2.0 * ap * x + beta, slope_n)
        tl.store(dx_ptr + offsets, (g * slope).to(dx_ptr.dtype.element_ty), mask=mask)
        # Masked lanes loaded x = g = 0, so they add exactly 0 to both sums.
        sum_p += tl.where(positive, g * square, 0.0)
        sum_n += tl.where(positive, 0.0, g * integral_n)
    tl.store(partials_ptr + pid, tl.sum(sum_p, axis=0))
    tl.store(partials_ptr + n_programs + pid, tl.sum(sum_n, axis=0))


@triton.jit
def _sum_partials_kernel(
    partials_ptr, n_programs, d_alpha_p_ptr, d_alpha_n_ptr, BLOCK: tl.constexpr
):
    # One program, a fixed order: the same partials always give the same bits.
    sum_p = tl.zeros([BLOCK], dtype=tl.float32)
    sum_n = tl.zeros([BLOCK], dtype=tl.float32)
    for first in range(0, n_programs, BLOCK):
        offsets = first + tl.arange(0, BLOCK)
        mask = offsets < n_programs
        sum_p += tl.load(partials_ptr + offsets, mask=mask, other=0.0)
        sum_n += tl.load(partials_ptr + n_programs + offsets, mask=mask, other=0.0)
    tl.store(d_alpha_p_ptr, tl.sum(sum_p, axis=0).to(d_alpha_p_ptr.dtype.element_ty))
    tl.store(d_alpha_n_ptr, tl.sum(sum_n, axis=0).to(d_alpha_n_ptr.dtype.element_ty))


def same_layout_input(x: Tensor) -> Tensor:
    """``x`` as the kernels index it: a flat buffer, element i of the output at memory offset i
    of the input. A dense input (contiguous, transposed, channels-last, any permutation) is
    used as it is, and ``empty_like`` gives the output the same strides, which are also the
    ones the op's fake implementation (``empty_like(x)``) promises under ``torch.compile``;
    an input with gaps (a slice) is copied to a contiguous one, and ``empty_like`` of it is
    contiguous too, as ``empty_like`` of the sliced input is."""
    if torch.empty_like(x).stride() == x.stride():
        return x
    return x.contiguous()


def forward(
    x: Tensor,
    alpha_p: Tensor,
    alpha_n: Tensor,
    beta: float,
    eps: float,
    kind: str,
    config: KernelConfig | None = None,
) -> Tensor:
    x = same_layout_input(x)
    y = torch.empty_like(x)  # the layout the op's fake implementation promises
    n = x.numel()
    config = config or config_for(x.dtype)
    if n:
        _forward_kernel[(triton.cdiv(n, config.block),)](
            x,
            y,
            alpha_p,
            alpha_n,
            n,
            beta,
            eps,
            KIND=KINDS[kind],
            BLOCK=config.block,
            num_warps=config.warps,
        )
    return y


def backward(
    grad: Tensor,
    x: Tensor,
    alpha_p: Tensor,
    alpha_n: Tensor,
    beta: float,
    eps: float,
    kind: str,
    config: KernelConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dx and the two alpha gradients (separate tensors: a custom op may not return views)."""
    x = same_layout_input(x)
    dx = torch.empty_like(x)
    if grad.stride() != x.stride():  # the kernel reads grad and x at the same memory offsets
        grad = torch.empty_like(x).copy_(grad)
    n = x.numel()
    # written by the reduction kernel below (no fill launched), or zero for an empty input
    new_gradient = torch.empty if n else torch.zeros
    d_alpha_p = new_gradient(1, device=x.device, dtype=alpha_p.dtype)
    d_alpha_n = new_gradient(1, device=x.device, dtype=alpha_n.dtype)
    if not n:
        return dx, d_alpha_p, d_alpha_n
    config = config or config_for(x.dtype)
    programs = triton.cdiv(n, config.block * config.blocks_per_program)
    # every program writes its two partials, so no zero fill is needed
    partials = torch.empty(2 * programs, device=x.device, dtype=torch.float32)
    _backward_kernel[(programs,)](
        grad,
        x,
        dx,
        partials,
        programs,
        alpha_p,
        alpha_n,
        n,
        beta,
        eps,
        KIND=KINDS[kind],
        BLOCK=config.block,
        BLOCKS_PER_PROGRAM=config.blocks_per_program,
        num_warps=config.warps,
    )
    _sum_partials_kernel[(1,)](partials, programs, d_alpha_p, d_alpha_n, BLOCK=_REDUCE_BLOCK)
    return dx, d_alpha_p, d_alpha_n
