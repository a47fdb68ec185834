"""Benchmark activations: forward+backward time and bytes saved for backward.

    python -m scripts.bench.activations                       # 8x1024x1536 fp32 on CPU
    python -m scripts.bench.activations --dtype bfloat16 --device cuda --all

Every row is timed in the same run as ReLU², and the table prints each time as a ratio to ReLU²
(eager against eager, compiled against compiled). "saved/x" is the size of the tensors autograd
keeps for backward divided by the input's size, measured with saved-tensor hooks. Reference rows:
"copy (floor)" is one clone of the input, the least any pointwise op can cost; "xielu paper
reference" is the appendix code run through plain autograd (``xielu.reference``).
On a GPU each sample is a run of back-to-back calls lasting ``--sample-ms`` (20 ms), so the CPU
queues the next call while the GPU runs this one, as in training; ``--sample-ms 0`` times one
call at a time, which adds the launch latency a training step hides (the Python of a custom op,
autograd, the launches themselves) and penalises the ops with more of it.
Results are printed, never asserted: speed is measured here, not in the tests.
"""

from __future__ import annotations

import argparse

import torch

from scripts.common import median_ms, saved_bytes
from xielu import available_activations, get_activation, is_gated
from xielu.reference import ReferenceXIELU

FLOOR = "copy (floor)"
DEFAULT_ROWS = [
    "relu2",
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "elu",
    "xsilu",
    "swiglu",
    "xielu",
    "xiprelu",
    "xielu[eager]",
    "xiprelu[eager]",
    "xielu paper reference",
]


def build(row: str, device: torch.device) -> tuple[torch.nn.Module, bool]:
    """The module for a row and whether it is gated."""
    if row == "xielu paper reference":
        return ReferenceXIELU().to(device), False
    if row.endswith("[eager]"):
        name = row.removesuffix("[eager]")
        return get_activation(name, backend="eager").to(device), False
    return get_activation(row).to(device), is_gated(row)


def measure(row: str, args, device: torch.device, compiled: bool) -> tuple[float, float]:
    dtype = getattr(torch, args.dtype)
    shape = tuple(args.shape)
    if row == FLOOR:
        src = torch.randn(shape, device=device, dtype=dtype)
        return median_ms(src.clone, device, args.warmup, args.repeats, args.sample_ms), 0.0
    module, gated = build(row, device)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    up = torch.randn(shape, device=device, dtype=dtype, requires_grad=True) if gated else None
    grad = torch.randn(shape, device=device, dtype=dtype)
    fn = torch.compile(module) if compiled else module

    def forward() -> torch.Tensor:
        return fn(x, up) if gated else fn(x)

    def step() -> None:
        forward().backward(grad)
        x.grad = None
        if up is not None:
            up.grad = None
        for p in module.parameters():
            p.grad = None

    ms = median_ms(step, device, args.warmup, args.repeats, args.sample_ms)
    return ms, saved_bytes(forward) / (x.numel() * x.element_size())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", type=int, nargs="+", default=[8, 1024, 1536])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--sample-ms",
        type=float,
        default=None,
        help="back-to-back calls per timed sample, in ms (default: 20 on CUDA, 0 on CPU)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled columns")
    parser.add_argument("--all", action="store_true", help="every registered activation")
    parser.add_argument("--rows", nargs="+", help="explicit rows (registry names or those below)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.sample_ms is None:
        args.sample_ms = 20.0 if device.type == "cuda" else 0.0
    torch.manual_seed(0)

    rows = args.rows or (available_activations() + DEFAULT_ROWS[-3:] if args.all else DEFAULT_ROWS)
    fixed = ("relu2", FLOOR)
    rows = ["relu2"] + [r for r in dict.fromkeys(rows) if r not in fixed] + [FLOOR]
    print(
        f"shape={tuple(args.shape)} dtype={args.dtype} device={device} "
        f"threads={torch.get_num_threads()} torch={torch.__version__} "
        f"sample={args.sample_ms:g} ms of back-to-back calls"
    )
    header = f"{'activation':<24}{'eager ms':>10}{'x relu2':>9}{'saved/x':>9}"
    if not args.no_compile:
        header += f"{'compiled ms':>13}{'x relu2':>9}{'saved/x':>9}"
    print(header)
    print("-" * len(header))
    baseline: dict[bool, float] = {}
    for row in rows:
        line = f"{row:<24}"
        for compiled in [False] + ([] if args.no_compile else [True]):
            ms, saved = measure(row, args, device, compiled)
            baseline.setdefault(compiled, ms)
            saved_text = "-" if row == FLOOR else f"{saved:.2f}"
            line += (
                f"{ms:>{13 if compiled else 10}.2f}{ms / baseline[compiled]:>9.2f}{saved_text:>9}"
            )
        print(line, flush=True)
    print("gated rows take two inputs of the shape (gate, up); saved/x is against one of them.")


if __name__ == "__main__":
    main()
