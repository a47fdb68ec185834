"""Benchmark scoring continuations (what lm-eval's multiple-choice tasks ask): the LM head on the
continuation's tokens only (``model.loss.token_scores``, the adapter's path) against the
log-softmax of the whole logits tensor, then picking the continuation's entries.

    python -m scripts.bench.scoring                          # CPU, Llama 3's vocabulary
    python -m scripts.bench.scoring --device cuda --vocab 131072 --dim 1536 --length 2048

A batch of ``--batch`` contexts of ``--length`` tokens, each followed by a continuation of
``--continuation`` tokens (an answer choice is a few). Both rows start from the same final
hidden states and give the same numbers (checked before timing); the trunk of the model is the
same for both and not timed. Ratios are to the first row. Results are printed, never asserted.
"""

from __future__ import annotations

import argparse

import torch

from model.loss import token_scores
from scripts.common import markdown, median_ms_and_peak_gib

IGNORE = -100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8, help="requests per forward")
    parser.add_argument("--length", type=int, default=256, help="tokens per request")
    parser.add_argument("--continuation", type=int, default=4, help="scored tokens per request")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=128256, help="default: Llama 3's")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if not 0 < args.continuation <= args.length:
        raise SystemExit(f"--continuation must be in 1..--length, got {args.continuation}")
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (args.batch, args.length)
    hidden = torch.randn(*shape, args.dim, device=device, generator=gen)
    weight = torch.randn(args.vocab, args.dim, device=device, generator=gen) * args.dim**-0.5
    targets = torch.full(shape, IGNORE, dtype=torch.long, device=device)
    targets[:, -args.continuation :] = torch.randint(
        0, args.vocab, (args.batch, args.continuation), device=device, generator=gen
    )

    def scored_only():
        logprobs, greedy = token_scores(hidden, weight, targets)
        return logprobs.sum(dim=1), greedy.all(dim=1)

    def full_logits():
        logprobs = torch.log_softmax((hidden @ weight.t()).float(), dim=-1)
        picked = logprobs[:, -args.continuation :]
        wanted = targets[:, -args.continuation :]
        totals = picked.gather(-1, wanted[..., None])[..., 0].sum(dim=1)
        return totals, (picked.argmax(-1) == wanted).all(dim=1)

    with torch.no_grad():
        ours, reference = scored_only(), full_logits()
        torch.testing.assert_close(ours[0], reference[0], rtol=1e-4, atol=1e-3)
        rows = [
            measure("continuation tokens only (token_scores)", scored_only, device, args),
            measure("full logits, then pick", full_logits, device, args),
        ]
    print_table(rows, args)
    return rows


def measure(name: str, fn, device: torch.device, args: argparse.Namespace) -> dict:
    ms, peak_gib = median_ms_and_peak_gib(fn, device, args.warmup, args.repeats)
    return {"name": name, "ms": ms, "peak_gib": peak_gib}


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    base = next((row["ms"] for row in rows if row["ms"] is not None), None)
    table = []
    for row in rows:
        if row["ms"] is None:
            table.append([row["name"], "OOM", "", ""])
            continue
        peak = "" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}"
        table.append([row["name"], f"{row['ms']:.2f}", f"x{row['ms'] / base:.3f}", peak])
    print(
        f"scoring {args.batch} requests of {args.length} tokens ({args.continuation} scored each), "
        f"dim {args.dim} x vocab {args.vocab} on {args.device}; ratios to the first row"
    )
    print("\n".join(markdown(["rows", "ms", "ratio", "peak GiB"], table)))


if __name__ == "__main__":
    main()
