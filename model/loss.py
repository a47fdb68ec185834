"""LM head and cross-entropy fused, in chunks of tokens, so full logits never exist.

At the paper's 1.1B setup one GPU holds 5 x 4096 tokens and a 147456-entry vocabulary: the fp32
logits alone are 12 GB, their log-softmax and gradient as much again. Here the forward walks
over chunks of tokens, computes each chunk's logits, its loss, and straight away its gradient
with respect to the hidden states and the head weight (softmax - one_hot, times the other
operand), then drops the chunk. Backward only scales the stored gradients by the incoming
scalar. Same matmuls as the plain path (one forward, two backward), a fraction of the memory
traffic, and a peak of one chunk of logits.

Matmuls run in the compute dtype (bf16 under autocast, with fp32 accumulation inside the GEMM);
softmax, loss and the sum of the weight gradient over chunks in fp32 whatever the input dtype;
targets equal to ``ignore_index`` contribute neither loss nor gradient, and the mean is over
the counted targets (``F.cross_entropy`` semantics; with none counted the loss is 0, not nan).

z-loss (PaLM; ``loss.z_loss``): ``z * lse^2`` per counted token, ``lse`` the log of the
softmax's normaliser, keeps the logits from drifting up. Its gradient, ``2 z lse softmax``,
joins the cross-entropy's in the same pass: each row's softmax is scaled by ``1 + 2 z lse``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk: int,
        ignore: int,
        grad: bool,
        compiled: bool,
        z_loss: float,
    ):
        n = hidden.shape[0]
        valid = targets != ignore
        count = valid.sum().clamp(min=1)
        # grad=False (evaluation under no_grad): no gradient work and no vocab x dim buffer
        needs_h, needs_w = ctx.needs_input_grad[0] and grad, ctx.needs_input_grad[1] and grad
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 for bf16, fp64 stays
        compute = matmul_dtype(hidden)
        w = weight.to(compute)  # one cast for all chunks (autocast would cast per matmul)
        compiled = compiled and not bf16_gemm_taken_in_fp32(w)
        chunk_math = _compiled_chunk_math() if compiled else chunk_loss_and_grad
        grad_hidden = torch.empty_like(hidden) if needs_h else None
        grad_weight = torch.zeros_like(weight, dtype=acc) if needs_w else None
        row_scale = valid.to(acc) / count if needs_h or needs_w else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            h = hidden[rows].to(compute)
            scale = row_scale[rows] if row_scale is not None else None
            losses, dlogits = chunk_math(h, w, targets[rows], valid[rows], scale, z_loss)
            total += losses.sum()
            if needs_h:
                grad_hidden[rows] = gemm(dlogits, w)
            if needs_w and compute == acc:
                grad_weight.addmm_(dlogits.t(), h)
            elif needs_w:  # a bf16 GEMM (tensor cores), summed over chunks in fp32
                grad_weight += gemm(dlogits.t(), h)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_loss.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return dh, dw, None, None, None, None, None, None


def chunk_loss_and_grad(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    valid: Tensor,
    row_scale: Tensor | None,
    z_loss: float = 0.0,
) -> tuple[Tensor, Tensor | None]:
    """One chunk's logits ``h @ weight.T``, their per-row losses (fp32, 0 on ignored rows; plus
    ``z_loss * lse^2``) and, given ``row_scale`` (each row's weight in the mean: 1/count, 0 if
    ignored), d loss / d logits in the matmul's dtype.

    All the work between the head's matmuls sits in this one function so that
    ``torch.compile`` can make two passes over the logits of it (max and sum of exponentials,
    then the gradient), where eager ops make about eight, each reading or writing the whole
    chunk in fp32. Eagerly it works in place on one fp32 copy of the logits and drops the bf16
    ones at once: about 6 bytes per logit at the peak (the fp32 softmax and the bf16 gradient),
    compiled about 4 (the bf16 logits and gradient).
    """
    logits = gemm(h, weight.t())
    out_dtype = logits.dtype
    x = logits.to(torch.promote_types(out_dtype, torch.float32))
    del logits  # eager: the bf16 logits go as soon as the fp32 copy exists
    safe = torch.where(valid, targets, 0)
    target_logit = x.gather(1, safe[:, None]).squeeze(1)
    # log-sum-exp by hand, in place, so the exponentials are reused for the gradient
    row_max = x.amax(dim=-1)
    exps = x.sub_(row_max[:, None]).exp_()
    sum_exp = exps.sum(dim=-1)
    lse = row_max + sum_exp.log()
    losses = (lse - target_logit + z_loss * lse * lse) * valid
    if row_scale is None:
        return losses, None
    # d/dlogits of z lse^2 is 2 z lse softmax: the softmax part of the gradient, rescaled
    scale = row_scale / sum_exp * (1 + 2 * z_loss * lse) if z_loss else row_scale / sum_exp
    dlogits = exps.mul_(scale[:, None]).to(out_dtype)
    # the target's entry, (softmax - 1) * row_scale, in fp32 before rounding: a confident right
    # model has softmax ~ 1 there, and a softmax rounded to bf16 first would cancel to 0
    target_grad = (target_logit - row_max).exp() * scale - row_scale
    dlogits[torch.arange(len(safe), device=safe.device), safe] = target_grad.to(out_dtype)
    return losses, dlogits


# on a CPU, bf16 GEMMs taken in fp32 (``gemm``); tests of what a GPU runs turn it off
BF16_GEMMS_IN_FP32_ON_CPU = True


def bf16_gemm_taken_in_fp32(a: Tensor) -> bool:
    """Whether ``gemm`` takes a product with ``a`` in fp32 (a bf16 operand on a CPU).

    The chunk's math then runs eagerly even where the trainer compiles it: compiled code
    cannot take that path, and the bf16 GEMM it would run instead costs more than the whole
    eager chunk (about 10 s of a 2-rank, 8-step run of the tests' shrunk ``paper_1b``).
    """
    return a.device.type == "cpu" and BF16_GEMMS_IN_FP32_ON_CPU and a.dtype == torch.bfloat16


def gemm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``; on a CPU, a bf16 product is taken in fp32 and rounded back to bf16.

    The same numbers as a bf16 GEMM with fp32 accumulation (bf16 values are exact in fp32;
    only the order of the sums may differ), which is what the GPU runs. A CPU without bf16
    instructions takes the head's bf16 GEMMs (a 147456-long dimension at the paper's
    vocabulary) many times slower than fp32 ones: ``[32, 147456] @ [147456, 32]`` 0.77 s
    against 0.05 s on the 2-core test machine, most of a bf16 test run's time. Not inside
    ``torch.compile``: Inductor fuses the rounding to bf16 away from the fp32 product.
    """
    if bf16_gemm_taken_in_fp32(a) and not torch.compiler.is_compiling():
        with torch.autocast("cpu", enabled=False):  # else autocast makes it bf16 again
            return (a.float() @ b.float()).to(torch.bfloat16)
    return a @ b


@functools.cache
def _compiled_chunk_math():
    # shapes: every chunk but the last has the same rows; evaluation adds a gradient-free variant
    return torch.compile(chunk_loss_and_grad)


def matmul_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the head's matmuls run in: autocast's when it is on (as ``nn.Linear`` would),
    else the input's. Softmax, loss and the weight-gradient sum stay in fp32 regardless."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_size: int = 4096,
    ignore_index: int = -100,  # F.cross_entropy's default, as everywhere in torch
    compiled: bool = False,
    z_loss: float = 0.0,
) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, chunked over tokens,
    plus ``z_loss`` times the mean squared log-normaliser of the counted rows.

    ``hidden`` is [..., dim], ``targets`` the matching [...] integer tensor. Equal to
    ``F.cross_entropy(hidden @ weight.T, targets, ignore_index=...)`` up to float rounding.
    ``compiled``: each chunk's softmax and gradient through ``torch.compile``
    (``chunk_loss_and_grad``); the trainer turns it on when it compiles the blocks.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if matmul_dtype(hidden) == torch.float16:
        # the gradient of the mean is computed here, scaled by 1/tokens, and rounded to the
        # matmul dtype before backward could apply a loss scale: in fp16 it underflows
        raise ValueError(
            "the fused LM-head loss does not support fp16 (its per-token gradients, ~1/tokens, "
            "are rounded to fp16 before any loss scaling and lose precision): use bf16 "
            "autocast or fp32"
        )
    return _ChunkedLinearCrossEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        targets.reshape(-1),
        chunk_size,
        ignore_index,
        torch.is_grad_enabled(),
        compiled,
        float(z_loss),
    )


@torch.no_grad()
def token_scores(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_size: int = 4096,
    ignore_index: int = -100,
) -> tuple[Tensor, Tensor]:
    """(log p(target), whether the target is the argmax) per token of ``hidden @ weight.T``,
    both shaped like ``targets``; an ignored target gets 0 and True.

    What scoring needs (``eval.harness``: a continuation's log-likelihood, and whether greedy
    decoding would produce it) without the [tokens, vocab] log-softmax: at the paper's vocab a
    batch of 8 x 2048 tokens would hold 8.6 GB of fp32 logits, here one chunk. Only the scored
    tokens reach the head: a multiple-choice answer is a few tokens after a long context. The
    matmul runs in ``matmul_dtype``, the log-softmax in fp32 (fp64 stays).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    flat_targets = targets.reshape(-1)
    scored = (flat_targets != ignore_index).nonzero().squeeze(1)  # only these reach the head
    picked = hidden.reshape(-1, hidden.shape[-1])[scored]
    compute = matmul_dtype(hidden)
    w = weight.to(compute)
    acc = torch.promote_types(compute, torch.float32)
    logprobs = torch.zeros(flat_targets.shape, dtype=acc, device=hidden.device)
    greedy = torch.ones(flat_targets.shape, dtype=torch.bool, device=hidden.device)
    for start in range(0, len(scored), chunk_size):
        rows = scored[start : start + chunk_size]
        x = gemm(picked[start : start + chunk_size].to(compute), w.t()).to(acc)
        target = flat_targets[rows]
        target_logit = x.gather(1, target[:, None]).squeeze(1)
        logprobs[rows] = target_logit - x.logsumexp(dim=-1)
        greedy[rows] = x.argmax(dim=-1) == target
    return logprobs.view(targets.shape), greedy.view(targets.shape)
