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
the counted targets (``F.cross_entropy`` semantics).
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, ignore: int, grad: bool
    ):
        n = hidden.shape[0]
        valid = targets != ignore
        count = valid.sum().clamp(min=1)
        # grad=False (evaluation under no_grad): no gradient work and no vocab x dim buffer
        needs_h, needs_w = ctx.needs_input_grad[0] and grad, ctx.needs_input_grad[1] and grad
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 for bf16, fp64 stays
        compute = matmul_dtype(hidden)
        w = weight.to(compute)  # one cast for all chunks (autocast would cast per matmul)
        grad_hidden = torch.empty_like(hidden) if needs_h else None
        grad_weight = torch.zeros_like(weight, dtype=acc) if needs_w else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, n, chunk):
            h = hidden[start : start + chunk].to(compute)
            t = targets[start : start + chunk]
            ok = valid[start : start + chunk]
            logits = (h @ w.t()).to(acc)
            safe_t = torch.where(ok, t, 0)
            target_logit = logits.gather(1, safe_t[:, None]).squeeze(1)
            # log-sum-exp by hand, in place, so the exponentials are reused for the gradient
            row_max = logits.amax(dim=-1, keepdim=True)
            exps = logits.sub_(row_max).exp_()
            sum_exp = exps.sum(dim=-1)
            lse = row_max.squeeze(1) + sum_exp.log()
            total += ((lse - target_logit) * ok).sum()
            if needs_h or needs_w:
                # d loss / d logits = (softmax - one_hot) / count, zero on ignored rows
                row_scale = ok.to(acc) / count
                probs = exps.mul_((row_scale / sum_exp)[:, None])
                probs[torch.arange(len(t), device=t.device), safe_t] -= row_scale
                probs = probs.to(compute)
                if needs_h:
                    grad_hidden[start : start + chunk] = probs @ w
                if needs_w and compute == acc:
                    grad_weight.addmm_(probs.t(), h)
                elif needs_w:  # a bf16 GEMM (tensor cores), summed over chunks in fp32
                    grad_weight += probs.t() @ h
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_loss.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return dh, dw, None, None, None, None


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
    ignore_index: int = IGNORE_INDEX,
) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, chunked over tokens.

    ``hidden`` is [..., dim], ``targets`` the matching [...] integer tensor. Equal to
    ``F.cross_entropy(hidden @ weight.T, targets, ignore_index=...)`` up to float rounding.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return _ChunkedLinearCrossEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        targets.reshape(-1),
        chunk_size,
        ignore_index,
        torch.is_grad_enabled(),
    )
