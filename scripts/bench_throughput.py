"""The paper's efficiency table: time per training iteration and peak memory per activation.

    python scripts/bench_throughput.py                         # small model, CPU, fp32
    python scripts/bench_throughput.py --preset paper_1b --batch 5 --seq 4096 --bf16 --compile

Every activation trains the same model at matched size (plain MLPs 1.5x wider than gated ones,
``model/config.py``) with the trainer's recipe: fp32 weights, bf16 autocast when ``--bf16``,
AdamW from ``training.optim``, per-block ``torch.compile`` when ``--compile``, optional
activation checkpointing. One iteration = forward with the fused loss, backward, optimizer step.

Memory, two ways. "saved GiB": the bytes autograd keeps for backward in one iteration (saved-tensor
hooks on the eager model), the part of training memory an activation changes, exact on any
device. "peak GiB": ``torch.cuda.max_memory_allocated`` over the timed iterations, with the
share of the GPU's memory as the paper reports it; GPUs only (a CPU process's resident size
says more about the allocator than about the model). Each activation runs in a fresh process,
so no allocator cache or compiled graph carries over between rows.

Times are medians, printed as ratios to ReLU² beside the paper's GH200 numbers (4 GPUs, its
xIELU/xIPReLU unfused under ``torch.compile``). Results are printed, never asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.paper import EFFICIENCY_TABLE
from model.presets import available_presets
from scripts.tables import markdown, write_csv

BASELINE = "relu2"


def measure(activation: str, args: argparse.Namespace) -> dict:
    """One activation's row, measured in this (fresh) process."""
    from model import Llama
    from model.presets import load_preset
    from scripts.bench_activations import saved_bytes
    from scripts.timing import median_ms
    from training.config import OptimConfig
    from training.loop import autocast_factory
    from training.optim import build_optimizer

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = load_preset(args.preset, activation=activation, **model_overrides(args))
    model = Llama(config).to(device)
    optimizer = build_optimizer(model, OptimConfig(), device)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), device=device)
    autocast = autocast_factory(args.bf16, device)

    def forward() -> torch.Tensor:
        with autocast():
            return model(tokens[:, :-1], tokens[:, 1:])

    def iteration() -> None:
        forward().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for block in model.layers:
        block.checkpointed = args.checkpointing
    saved = saved_bytes(forward)
    if args.compile:
        for block in model.layers:
            block.compile()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    ms = median_ms(iteration, device, args.warmup, args.repeats)
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    return {
        "activation": activation,
        "mlp_hidden": config.hidden,
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "ms_per_iteration": ms,
        "tokens_per_s": args.batch * args.seq / (ms / 1e3),
        "saved_gib": saved / 2**30,
        "peak_gib": peak / 2**30 if cuda else None,
        "peak_percent": 100 * peak / total if cuda else None,
    }


def model_overrides(args: argparse.Namespace) -> dict:
    overrides = {"max_seq_len": max(args.seq, 16)}
    if args.vocab_size:
        overrides["vocab_size"] = args.vocab_size
    if args.preset == "tiny":
        # as in the paper's models: gated width 4 x dim, plain 6 x dim
        overrides.update(dim=args.dim, n_layers=args.layers, gated_hidden=4 * args.dim)
    return overrides


def measure_in_fresh_process(activation: str, args: argparse.Namespace) -> dict:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(measure, (activation, args))


def table(rows: list[dict]) -> list[str]:
    paper = {row.activation: row for row in EFFICIENCY_TABLE}
    ours_base = next(r["ms_per_iteration"] for r in rows if r["activation"] == BASELINE)
    paper_base = paper[BASELINE].ms_per_iteration
    body = []
    for r in sorted(rows, key=lambda r: -r["ms_per_iteration"]):
        ref = paper.get(r["activation"])
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f} ({r['peak_percent']:.0f}%)"
        body.append(
            [
                r["activation"],
                str(r["mlp_hidden"]),
                f"{r['parameters_m']:.1f}",
                f"{r['saved_gib']:.3f}",
                peak,
                f"{r['ms_per_iteration']:.1f}",
                f"{r['ms_per_iteration'] / ours_base:.3f}",
                f"{r['tokens_per_s']:.0f}",
                f"{ref.ms_per_iteration:.0f}" if ref else "-",
                f"{ref.ms_per_iteration / paper_base:.3f}" if ref else "-",
            ]
        )
    header = [
        "activation",
        "MLP hidden",
        "params (M)",
        "saved GiB",
        "peak GiB",
        "ms/iter",
        f"x {BASELINE}",
        "tokens/s",
        "paper ms/iter",
        f"paper x {BASELINE}",
    ]
    return markdown(header, body)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", choices=available_presets())
    parser.add_argument("--dim", type=int, default=384, help="override the tiny preset")
    parser.add_argument("--layers", type=int, default=4, help="override the tiny preset")
    parser.add_argument("--vocab-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as the trainer")
    parser.add_argument("--compile", action="store_true", help="torch.compile every block")
    parser.add_argument("--checkpointing", action="store_true", help="recompute every block")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--activations", nargs="+", default=[row.activation for row in EFFICIENCY_TABLE]
    )
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    if BASELINE not in args.activations:
        args.activations.append(BASELINE)
    if args.preset == "tiny" and args.vocab_size is None:
        args.vocab_size = 8192

    print(
        f"{args.preset}: batch {args.batch} x {args.seq} tokens on {args.device}, "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}, "
        f"{'compiled' if args.compile else 'eager'} blocks"
        f"{', activation checkpointing' if args.checkpointing else ''}; "
        f"median of {args.repeats} iterations (forward+loss+backward+AdamW)\n"
    )
    rows = []
    for activation in args.activations:
        rows.append(measure_in_fresh_process(activation, args))
        print(f"  {activation}: {rows[-1]['ms_per_iteration']:.1f} ms", flush=True)
    print()
    print("\n".join(table(rows)))
    if args.csv:
        write_csv(rows, args.csv)
    return rows


if __name__ == "__main__":
    main()
