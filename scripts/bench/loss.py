"""Benchmark the fused LM head + cross-entropy (``model/loss.py``): chunk sizes, eager vs compiled.

    python -m scripts.bench.loss                                  # CPU, a small head
    python -m scripts.bench.loss --device cuda --tokens 20480 --dim 1536 --vocab 147456

The second line is the paper's 1.1B head (``configs/model/paper_1b.yaml``) at 5 x 4096 tokens
per GPU. One row = forward + backward of ``linear_cross_entropy`` under bf16 autocast, as the
trainer runs it. Every row is timed in the same run and printed as a ratio to the first (eager,
the smallest chunk). What the rows separate:

- eager vs compiled: the softmax and its gradient between the GEMMs, as about eight eager passes
  over each chunk's logits (several in fp32) or as the two passes Inductor makes of them;
- the chunk size: every chunk reads the head's weight twice and adds its vocab x dim weight
  gradient into the fp32 sum, so small chunks pay that traffic many times, and a weight-gradient
  GEMM with only ``chunk`` tokens of depth may be bound by memory, not by its FLOPs; large chunks
  hold more logits at once (the "peak" column, CUDA only).

"full logits" is the unfused reference: ``F.cross_entropy`` of the whole logits tensor. A row that
runs out of memory says so. Results are printed, never asserted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from model.loss import linear_cross_entropy
from scripts.common import markdown, median_ms_and_peak_gib


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per step on one device")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--no-compile", action="store_true", help="eager rows only")
    parser.add_argument("--no-full", action="store_true", help="skip the full-logits reference")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(args.tokens, args.dim, device=device, generator=gen, requires_grad=True)
    weight = torch.randn(args.vocab, args.dim, device=device, generator=gen) * args.dim**-0.5
    weight.requires_grad_(True)
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=gen)

    def fused(chunk: int, compiled: bool):
        return lambda: linear_cross_entropy(hidden, weight, targets, chunk, compiled=compiled)

    def full_logits():
        return F.cross_entropy(hidden @ weight.t(), targets)

    rows = []
    for chunk in args.chunks:
        for compiled in (False,) if args.no_compile else (False, True):
            name = f"chunk {chunk}, {'compiled' if compiled else 'eager'}"
            rows.append(measure(name, fused(chunk, compiled), hidden, weight, device, args))
    if not args.no_full:
        rows.append(measure("full logits", full_logits, hidden, weight, device, args))
    print_table(rows, args)
    return rows


def measure(
    name: str,
    loss_fn: Callable[[], torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    device: torch.device,
    args: argparse.Namespace,
) -> dict:
    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        hidden.grad = weight.grad = None

    ms, peak_gib = median_ms_and_peak_gib(step, device, args.warmup, args.repeats)
    hidden.grad = weight.grad = None  # an out-of-memory step may leave them behind
    return {"name": name, "ms": ms, "peak_gib": peak_gib}


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    flops = 6 * args.tokens * args.dim * args.vocab  # logits, d hidden, d weight
    base = next((row["ms"] for row in rows if row["ms"] is not None), None)
    table = []
    for row in rows:
        if row["ms"] is None:
            table.append([row["name"], "OOM", "", "", ""])
            continue
        peak = "" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}"
        tflops = flops / row["ms"] / 1e9
        table.append(
            [row["name"], f"{row['ms']:.2f}", f"x{row['ms'] / base:.3f}", f"{tflops:.1f}", peak]
        )
    print(
        f"linear_cross_entropy forward+backward, {args.tokens} tokens x dim {args.dim} x vocab "
        f"{args.vocab}, bf16 autocast on {args.device}; ratios to the first row"
    )
    print("\n".join(markdown(["rows", "ms", "ratio", "TFLOP/s", "peak GiB"], table)))


if __name__ == "__main__":
    main()
