"""Attention within documents: tokens/s and peak memory of each kernel, against plain causal SDPA.

    python -m scripts.bench.attention                       # the paper's 1.1B heads, seq 1024-4096
    python -m scripts.bench.attention --seq 4096 --doc-tokens 512

Three ways to attend over packed windows (``model/document_attention.py``): plain causal SDPA
(attends across documents: the speed to beat), the dense [batch, 1, seq, seq] mask through SDPA
(the reference), and FlexAttention with a block mask (compiled). Documents have random
lengths around ``--doc-tokens`` (FineWeb-Edu's documents average about 1,000 tokens). On a GPU
each call is a forward and a backward; on a CPU a forward only, since FlexAttention has no
backward there. Peak memory: the attention call's own allocations (CUDA's allocator on a GPU,
the rise of a forked child's resident memory on a CPU), the block mask or dense mask included.
The ratios are against causal SDPA run in the same process.
"""

from __future__ import annotations

import argparse
import os
import resource

import torch
import torch.nn.functional as F

from model.document_attention import block_mask, dense_mask, flex
from scripts.common import markdown, median_ms_and_peak_gib


def document_ids(batch: int, seq: int, mean_tokens: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    starts = torch.rand(batch, seq, generator=gen) < 1 / mean_tokens
    starts[:, 0] = False
    return starts.long().cumsum(dim=1)


def kernels(ids: torch.Tensor) -> dict:
    return {
        "causal SDPA (no documents)": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True
        ),
        "dense mask SDPA": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask(ids)
        ),
        "flex": lambda q, k, v: flex(q, k, v, block_mask(ids), False),
    }


def measure(fn, q, k, v, backward: bool, repeats: int) -> tuple[float, int]:
    """(seconds per call, peak bytes of one call)."""

    def call():
        out = fn(q, k, v)
        if backward:
            out.backward(torch.ones_like(out))
        return out

    ms, peak_gib = median_ms_and_peak_gib(call, q.device, warmup=1, repeats=repeats)
    peak = peak_gib * 2**30 if peak_gib is not None else peak_in_a_child(call)
    return ms / 1e3, int(peak)


def peak_in_a_child(call) -> int:
    """Bytes the process's resident memory rose to during ``call``, measured in a forked child
    (its peak RSS less its RSS at the start): torch's CPU allocator keeps no statistics, and
    its memory tracker cannot follow FlexAttention's operator."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's tensors and compiled kernels, its own peak
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as statm:
            start = int(statm.read().split()[1]) * page
        call()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        os.write(write, str(max(peak - start, 0)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return int(text)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16, help="paper_1b: 16 heads of 96")
    parser.add_argument("--head-dim", type=int, default=96)
    parser.add_argument("--doc-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backward = device.type == "cuda"
    rows = []
    for seq in args.seq:
        ids = document_ids(args.batch, seq, args.doc_tokens).to(device)
        shape = (args.batch, args.heads, seq, args.head_dim)
        q, k, v = (
            torch.randn(shape, device=device, dtype=dtype, requires_grad=backward) for _ in range(3)
        )
        baseline = None
        for name, fn in kernels(ids).items():
            seconds, peak = measure(fn, q, k, v, backward, args.repeats)
            baseline = baseline or seconds
            row = {
                "seq": seq,
                "kernel": name,
                "documents": int(ids[0, -1]) + 1,
                "tokens_per_s": args.batch * seq / seconds,
                "time_vs_causal": seconds / baseline,
                "peak_mib": peak / 2**20,
            }
            rows.append(row)
            print(
                f"  seq {seq}, {name}: {row['tokens_per_s']:,.0f} tok/s, "
                f"x{row['time_vs_causal']:.2f} of causal, {row['peak_mib']:.0f} MiB",
                flush=True,
            )
    what = "forward + backward" if backward else "forward only (no flex backward on a CPU)"
    print(
        f"\n{device.type}, {str(dtype).removeprefix('torch.')}, batch {args.batch}, "
        f"{args.heads} heads of {args.head_dim}, documents of ~{args.doc_tokens} tokens, {what}\n"
    )
    header = ["seq", "documents", "kernel", "tokens/s", "time / causal SDPA", "peak MiB"]
    body = [
        [
            str(r["seq"]),
            str(r["documents"]),
            r["kernel"],
            f"{r['tokens_per_s']:,.0f}",
            f"x{r['time_vs_causal']:.2f}",
            f"{r['peak_mib']:.0f}",
        ]
        for r in rows
    ]
    print("\n".join(markdown(header, body)))
    return rows


if __name__ == "__main__":
    main()
