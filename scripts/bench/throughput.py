"""The paper's efficiency table: time per training iteration and peak memory per activation.

    python scripts/bench/throughput.py                         # small model, CPU, fp32
    python scripts/bench/throughput.py --preset paper_1b --batch 5 --seq 4096 --bf16 --compile
    # choose a run's settings: every combination, each activation at each
    python -m scripts.bench.throughput --preset paper_1b --seq 4096 --bf16 --batch 4 5 6 \
        --compile blocks model --checkpointing none selective full --activations relu2 xielu

Every activation trains the same model at matched size (plain MLPs 1.5x wider than gated ones,
``model/config.py``) with the trainer's recipe: fp32 weights, bf16 autocast when ``--bf16``,
AdamW from ``training.optim``, per-block ``torch.compile`` when ``--compile``, optional
activation checkpointing. One iteration = the trainer's own step (``training.step.train_step``):
forward with the fused loss, backward, gradient clipping, optimizer step.

Memory, two ways. "saved GiB": the bytes autograd keeps for backward in one iteration (saved-tensor
hooks on the eager model), the part of training memory an activation changes, exact on any
device. "peak GiB": ``torch.cuda.max_memory_allocated`` over the timed iterations, with the
share of the GPU's memory as the paper reports it; GPUs only (a CPU process's resident size
says more about the allocator than about the model). Each activation runs in a fresh process,
so no allocator cache or compiled graph carries over between rows.

Times are medians, printed as ratios to ReLU² at the same settings beside the paper's GH200
numbers (4 GPUs, its xIELU/xIPReLU unfused under ``torch.compile``). ``--batch``, ``--compile``
and ``--checkpointing`` take several values; every combination is a group of rows, an
out-of-memory one a row that says so, and the closing lines name each activation's fastest
settings. Results are printed, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
from dataclasses import asdict, dataclass
from itertools import repeat
from pathlib import Path

import torch

from eval.paper import EFFICIENCY_TABLE
from model.presets import available_presets
from scripts.common import markdown, write_csv
from training.runtime.float8 import RECIPES as FLOAT8_RECIPES
from training.runtime.parallelize import CHECKPOINTING, COMPILE_SCOPES
from xielu.fused.ops import BACKENDS

BASELINE = "relu2"


@dataclass(frozen=True)
class Settings:
    """The run settings one group of rows is measured at."""

    batch: int
    compile: str
    checkpointing: str
    float8: str = "none"

    def __str__(self) -> str:
        text = f"batch {self.batch}, compile {self.compile}, checkpointing {self.checkpointing}"
        return text if self.float8 == "none" else f"{text}, float8 {self.float8}"


def measure(activation: str, settings: Settings, args: argparse.Namespace) -> dict:
    """One activation's row, measured in this (fresh) process, through the trainer's code."""
    from model import Llama, training_flops_per_token
    from model.presets import load_preset
    from scripts.common import median_ms, saved_bytes
    from training.instruments.metrics import device_peak_flops
    from training.optim import OptimConfig, build_optimizer
    from training.runtime.distributed import Env
    from training.runtime.parallelize import ParallelConfig, apply_compile, parallelize
    from training.step import train_step

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = load_preset(args.preset, activation=activation, **model_overrides(args, activation))
    row = {"activation": activation, "mlp_hidden": config.hidden, **asdict(settings)}
    batch = settings.batch
    plan = ParallelConfig(
        precision="bf16" if args.bf16 else "fp32",
        activation_checkpointing=settings.checkpointing,
        float8=settings.float8,
    )  # compiled below
    cuda = device.type == "cuda"
    try:
        model = Llama(config).to(device)
        row["parameters_m"] = sum(p.numel() for p in model.parameters()) / 1e6
        training = parallelize(model, Env(0, 1, 0, device), plan)
        optimizer = build_optimizer(model, OptimConfig(), device)
        tokens = torch.randint(0, config.vocab_size, (batch, args.seq + 1), device=device)

        def forward() -> torch.Tensor:
            with training.autocast():
                return training(tokens[:, :-1], tokens[:, 1:])

        micro_batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
        clip = OptimConfig().grad_clip

        def iteration() -> None:  # the trainer's own step, one micro-batch, clipped as it clips
            train_step(training, optimizer, repeat(micro_batch), 1, clip)

        saved = saved_bytes(forward)  # measured eager: compile changes what autograd sees
        apply_compile(model, settings.compile)  # what parallelize does for parallel.compile
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        ms = median_ms(iteration, device, args.warmup, args.repeats)
    except torch.OutOfMemoryError:
        return {**row, "oom": True}
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    tokens_per_s = batch * args.seq / (ms / 1e3)
    peak_flops = device_peak_flops(device)
    flops_per_token = training_flops_per_token(config, args.seq)
    return {
        **row,
        "oom": False,
        "ms_per_iteration": ms,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops_per_token / peak_flops if peak_flops else None,
        "saved_gib": saved / 2**30,
        "peak_gib": peak / 2**30 if cuda else None,
        "peak_percent": 100 * peak / total if cuda else None,
    }


# the activations with a choice of path (``xielu.fused.ops``: the custom op or the traced one)
PATH_CHOICE = ("xielu", "xiprelu")


def model_overrides(args: argparse.Namespace, activation: str = "") -> dict:
    overrides = {"max_seq_len": max(args.seq, 16)}
    if activation in PATH_CHOICE and args.activation_backend != "auto":
        overrides["activation_kwargs"] = {"backend": args.activation_backend}
    if args.vocab_size:
        overrides["vocab_size"] = args.vocab_size
    if args.preset == "tiny":
        # as in the paper's models: gated width 4 x dim, plain 6 x dim
        overrides.update(dim=args.dim, n_layers=args.layers, gated_hidden=4 * args.dim)
    return overrides


def measure_in_fresh_process(activation: str, settings: Settings, args) -> dict:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(measure, (activation, settings, args))


def table(rows: list[dict]) -> list[str]:
    """One group of rows per settings, in the order measured; ratios within a group."""
    paper = {row.activation: row for row in EFFICIENCY_TABLE}
    paper_base = paper[BASELINE].ms_per_iteration
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["batch"], r["compile"], r["checkpointing"], r.get("float8", "none"))
        groups.setdefault(key, []).append(r)
    body = []
    for (batch, compile_scope, checkpointing, float8), group in groups.items():
        settings = [str(batch), compile_scope, checkpointing, float8]
        measured = [r for r in group if not r["oom"]]
        base = next((r for r in measured if r["activation"] == BASELINE), None)
        for r in sorted(measured, key=lambda r: -r["ms_per_iteration"]):
            ref = paper.get(r["activation"])
            peak = (
                "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f} ({r['peak_percent']:.0f}%)"
            )
            body.append(
                [
                    r["activation"],
                    *settings,
                    str(r["mlp_hidden"]),
                    f"{r['parameters_m']:.1f}",
                    f"{r['saved_gib']:.3f}",
                    peak,
                    f"{r['ms_per_iteration']:.1f}",
                    f"{r['ms_per_iteration'] / base['ms_per_iteration']:.3f}" if base else "-",
                    f"{r['tokens_per_s']:.0f}",
                    "-" if r["mfu"] is None else f"{r['mfu']:.1%}",
                    f"{ref.ms_per_iteration:.0f}" if ref else "-",
                    f"{ref.ms_per_iteration / paper_base:.3f}" if ref else "-",
                ]
            )
        for r in group:
            if r["oom"]:
                hint = "try --checkpointing" if checkpointing == "none" else "try a smaller --batch"
                body.append([r["activation"], *settings, f"OOM at batch {batch}: {hint}"])
                body[-1] += ["-"] * (len(HEADER) - len(body[-1]))
    return markdown(HEADER, body)


HEADER = [
    "activation",
    "batch",
    "compile",
    "checkpointing",
    "float8",
    "MLP hidden",
    "params (M)",
    "saved GiB",
    "peak GiB",
    "ms/iter",
    f"x {BASELINE}",
    "tokens/s",
    "MFU",
    "paper ms/iter",
    f"paper x {BASELINE}",
]


def fastest_settings(rows: list[dict]) -> dict[str, dict]:
    """Per activation, the row with the most tokens per second (out-of-memory rows excluded)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["oom"]:
            continue
        current = best.get(r["activation"])
        if current is None or r["tokens_per_s"] > current["tokens_per_s"]:
            best[r["activation"]] = r
    return best


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", choices=available_presets())
    parser.add_argument("--dim", type=int, default=384, help="override the tiny preset")
    parser.add_argument("--layers", type=int, default=4, help="override the tiny preset")
    parser.add_argument("--vocab-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--batch", type=int, nargs="+", default=[4], help="micro batch(es)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as the trainer")
    parser.add_argument(
        "--compile",
        nargs="*",
        default=["none"],
        choices=COMPILE_SCOPES,
        help="torch.compile each block (bare flag: blocks) or the whole model (model)",
    )
    parser.add_argument(
        "--checkpointing",
        nargs="*",
        default=["none"],
        choices=CHECKPOINTING,
        help="activation checkpointing: none, full (bare flag) or selective",
    )
    parser.add_argument(
        "--float8",
        nargs="+",
        default=["none"],
        choices=("none", *FLOAT8_RECIPES),
        help="FP8 linear layers through torchao (a CUDA GPU of compute capability 8.9+); "
        "MFU stays counted against the bf16 peak",
    )
    parser.add_argument(
        "--activation-backend",
        default="auto",
        choices=BACKENDS,
        help="xIELU's and xIPReLU's path: auto (the custom op's kernels), traced (an autograd "
        "function Inductor fuses with its neighbours, under --compile), or one kernel set",
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--activations", nargs="+", default=[row.activation for row in EFFICIENCY_TABLE]
    )
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    args.compile = args.compile or ["blocks"]
    args.checkpointing = args.checkpointing or ["full"]
    from training.runtime.float8 import refusal

    for recipe in args.float8:
        why = refusal(recipe, "bf16" if args.bf16 else "fp32", torch.device(args.device))
        if why:
            parser.error(why.replace("parallel.float8", "--float8").replace("trainer.", "--"))
    if BASELINE not in args.activations:
        args.activations.append(BASELINE)
    if args.preset == "tiny" and args.vocab_size is None:
        args.vocab_size = 8192

    grid = [
        Settings(*chosen)
        for chosen in itertools.product(args.batch, args.compile, args.checkpointing, args.float8)
    ]
    print(
        f"{args.preset}: {args.seq} tokens per sequence on {args.device}, "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}, xIELU/xIPReLU path "
        f"{args.activation_backend}; median of {args.repeats} iterations "
        "(forward+loss+backward+AdamW), each activation and settings in a fresh process\n"
    )
    rows = []
    for settings in grid:
        for activation in args.activations:
            rows.append(measure_in_fresh_process(activation, settings, args))
            ms = "out of memory" if rows[-1]["oom"] else f"{rows[-1]['ms_per_iteration']:.1f} ms"
            print(f"  {activation}, {settings}: {ms}", flush=True)
    print()
    print("\n".join(table(rows)))
    if len(grid) > 1:
        print("\nfastest settings per activation:")
        for activation, r in fastest_settings(rows).items():
            mfu = "" if r["mfu"] is None else f", MFU {r['mfu']:.1%}"
            settings = Settings(r["batch"], r["compile"], r["checkpointing"], r["float8"])
            print(f"  {activation}: {settings}: {r['tokens_per_s']:.0f} tokens/s{mfu}")
    if args.csv:
        write_csv(rows, args.csv)
    return rows


if __name__ == "__main__":
    main()
