"""Measure the Triton kernels' launch shapes on a GPU, against compiled ReLU² in the same run.

    python -m scripts.bench.tune_kernels                           # 5 x 4096 x 9216, bf16 and fp32
    python -m scripts.bench.tune_kernels --dtypes bfloat16 --blocks 1024 4096 --warps 4 8 16

For every launch shape (block, warps, blocks per backward program) it times xIELU's and
xIPReLU's forward + backward kernels, called directly (no autograd), and checks that two
backward calls give bit-identical alpha gradients. A row shows the time, the effective
bandwidth over the five passes no pointwise activation can avoid (read x, write y; read x and
grad, write dx) and the ratio to ReLU² compiled by Inductor, forward + backward, which is the
goal (within x1.05). Samples are 20 ms of back-to-back calls, as in
``scripts.bench.activations`` on a GPU.

The closing lines are the ``CONFIGS`` entries for ``xielu/fused/triton_kernels.py``: per dtype
the shape with the least time summed over both activations. The shapes are fixed, not autotuned
at run time, because the backward's reduction order depends on them (see that module).
Needs CUDA: timings of Triton's CPU interpreter say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scripts.common import markdown, median_ms

if TYPE_CHECKING:  # triton is imported only once a GPU is known to be there
    from xielu.fused.triton_kernels import KernelConfig

# xIELU's eps as the kernels see it (fp32)
EPS = float(torch.tensor(-1e-6, dtype=torch.float32))


@dataclass(frozen=True)
class Timing:
    dtype: str
    kind: str
    config: KernelConfig
    ms: float
    deterministic: bool


def best_configs(timings: list[Timing]) -> dict[str, KernelConfig]:
    """Per dtype, the deterministic launch shape with the least time summed over the kinds."""
    totals: dict[tuple[str, KernelConfig], float] = {}
    counts: dict[tuple[str, KernelConfig], int] = {}
    for t in timings:
        if not t.deterministic:
            continue
        key = (t.dtype, t.config)
        totals[key] = totals.get(key, 0.0) + t.ms
        counts[key] = counts.get(key, 0) + 1
    kinds = len({t.kind for t in timings})
    best: dict[str, KernelConfig] = {}
    for dtype, config in sorted(totals, key=totals.__getitem__):
        if counts[(dtype, config)] == kinds:  # measured for every kind
            best.setdefault(dtype, config)
    return best


def _relu2_ms(x: torch.Tensor, grad: torch.Tensor, args: argparse.Namespace) -> float:
    from xielu import get_activation

    relu2 = torch.compile(get_activation("relu2").to(x.device))
    x = x.detach().requires_grad_(True)

    def step() -> None:
        relu2(x).backward(grad)
        x.grad = None

    return median_ms(step, x.device, args.warmup, args.repeats, args.sample_ms)


def _kernel_timing(
    x: torch.Tensor,
    grad: torch.Tensor,
    dtype: str,
    kind: str,
    config: KernelConfig,
    args: argparse.Namespace,
) -> Timing:
    from xielu.fused import triton_kernels

    alpha_p = torch.tensor([0.8], device=x.device)
    alpha_n = torch.tensor([1.1], device=x.device)

    def step() -> None:
        triton_kernels.forward(x, alpha_p, alpha_n, 0.5, EPS, kind, config)
        triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind, config)

    ms = median_ms(step, x.device, args.warmup, args.repeats, args.sample_ms)
    first = triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind, config)[1:]
    second = triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind, config)[1:]
    same = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    return Timing(dtype, kind, config, ms, same)


def main(argv: list[str] | None = None) -> dict[str, KernelConfig]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", type=int, nargs="+", default=[5, 4096, 9216])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--blocks-per-program", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("tune_kernels needs a CUDA GPU: the Triton interpreter's timings mean nothing")
    from xielu.fused import triton_kernels

    configs = [
        triton_kernels.KernelConfig(block, warps, per_program)
        for block, warps, per_program in itertools.product(
            args.blocks, args.warps, args.blocks_per_program
        )
    ]
    print(f"{torch.cuda.get_device_name()}, shape {tuple(args.shape)}, torch {torch.__version__}")
    timings: list[Timing] = []
    for dtype in args.dtypes:
        gen = torch.Generator("cuda").manual_seed(0)
        x = torch.randn(args.shape, device="cuda", generator=gen).to(getattr(torch, dtype))
        grad = torch.randn(args.shape, device="cuda", generator=gen).to(x.dtype)
        passes = 5 * x.numel() * x.element_size()
        baseline = _relu2_ms(x, grad, args)
        rows = [["relu2 (compiled)", "-", f"{baseline:.3f}", f"{passes / baseline / 1e9:.2f}"]]
        rows[0] += ["1.000", "-"]
        for config, kind in itertools.product(configs, triton_kernels.KINDS):
            t = _kernel_timing(x, grad, dtype, kind, config, args)
            timings.append(t)
            shape = f"{config.block}/{config.warps}/{config.blocks_per_program}"
            rows.append(
                [kind, shape, f"{t.ms:.3f}", f"{passes / t.ms / 1e9:.2f}", f"{t.ms / baseline:.3f}"]
            )
            rows[-1].append("yes" if t.deterministic else "NO")
        del x, grad
        torch.cuda.empty_cache()
        print(f"\n{dtype} (block/warps/blocks per program; TB/s over 5 passes)\n")
        header = ["kernels", "shape", "ms", "TB/s", "x relu2", "deterministic"]
        print("\n".join(markdown(header, rows)))
    best = best_configs(timings)
    print("\nCONFIGS for xielu/fused/triton_kernels.py (least time over both activations):")
    for dtype, config in best.items():
        print(f"    torch.{dtype}: {config!r},")
    return best


if __name__ == "__main__":
    main()
