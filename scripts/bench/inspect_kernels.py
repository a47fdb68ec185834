"""The machine code of the Triton kernels for a Hopper GPU, read on any Linux machine.

    python -m scripts.bench.inspect_kernels                         # CONFIGS' launch shapes, sm_90
    python -m scripts.bench.inspect_kernels --block 4096 --warps 4 --blocks-per-program 4

Triton compiles ahead of time for a named target with the ``ptxas`` and ``cuobjdump`` its Linux
wheel ships, so what a kernel becomes on an H100 or GH200 can be checked without one. Per kernel
(xIELU and xIPReLU, forward and backward, bf16 and fp32) the table shows:

- the widest global load and store in bits: a pointwise kernel is bound by memory, and one that
  loses its 128-bit vector accesses loses much of its bandwidth;
- registers per thread and spilled bytes (occupancy, local-memory traffic);
- SASS instructions per element (of a program's code, so shown only for programs without a
  loop, one block each), beside the budget: how many one element may take before
  instruction issue, not memory, limits the kernel, at the ``--bandwidth`` it should reach
  (``--sms`` x 4 schedulers x ``--clock-ghz`` x 32 lanes per second, divided by elements per
  second). The defaults are an H100 SXM's, at the bandwidth compiled ReLU² reached there.

Sizes are compiled as the JIT specialises an aligned tensor whose size is a multiple of 16 (the
paper's shapes are). ``tests/test_kernel_code.py`` asserts the vector width and the absence of
spills on CPU, so a kernel change that loses either fails before it reaches a GPU.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from scripts.common import markdown

DTYPES = {"bfloat16": ("bf16", 2), "float32": ("fp32", 4)}
# element-sized tensors each pass reads or writes: x and y; x, grad and dx
PASSES = {"forward": 2, "backward": 3}


@dataclass(frozen=True)
class KernelCode:
    """What one compiled kernel is, in the numbers that bound a pointwise kernel's speed."""

    load_bits: int
    store_bits: int
    registers: int
    spill_bytes: int
    instructions: int


def _signature(fn, storage: str) -> dict[str, str]:
    """Triton types by argument name: the tensors' storage dtype for the data pointers, fp32
    for the alphas and partial sums, 32-bit sizes, fp32 constants."""
    fp32_pointers = {"alpha_p_ptr", "alpha_n_ptr", "partials_ptr"}
    types = {}
    for name, param in zip(fn.arg_names, fn.params, strict=True):
        if param.is_constexpr:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = "*fp32" if name in fp32_pointers else f"*{storage}"
        elif name.startswith("n_"):
            types[name] = "i32"
        else:
            types[name] = "fp32"
    return types


def compile_kernel(
    direction: str, kind: str, dtype: str, config, arch: int = 90
) -> dict[str, bytes | str]:
    """The kernel's code for ``sm_<arch>``: ``{"ptx": ..., "cubin": ...}``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from xielu.fused import triton_kernels

    fn = getattr(triton_kernels, f"_{direction}_kernel")
    signature = _signature(fn, DTYPES[dtype][0])
    constants = {"KIND": triton_kernels.KINDS[kind], "BLOCK": config.block}
    if "BLOCKS_PER_PROGRAM" in signature:
        constants["BLOCKS_PER_PROGRAM"] = config.blocks_per_program
    # what the JIT assumes of a 16-byte aligned tensor with a multiple of 16 elements
    aligned = [["tt.divisibility", 16]]
    attrs = {
        (i,): aligned
        for i, (name, kind_of) in enumerate(signature.items())
        if kind_of.startswith("*") or name == "n_elements"
    }
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options={"num_warps": config.warps}
    )
    return compiled.asm


def _cuda_tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.is_file():
        sys.exit(f"{path} is missing: inspect_kernels needs the Linux triton wheel's CUDA tools")
    return str(path)


def read_code(asm: dict[str, bytes | str]) -> KernelCode:
    """Vector widths from the PTX; registers, spills and instructions from the cubin."""
    ptx = asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        Path(cubin).write_bytes(asm["cubin"])
        dump = _cuda_tool("cuobjdump")
        usage = subprocess.run([dump, "-res-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([dump, "-sass", cubin], capture_output=True, text=True).stdout
    instructions = [
        op for op in re.findall(r"/\*[0-9a-f]{4}\*/\s+([A-Z][A-Z0-9_.]*)", sass) if op != "NOP"
    ]
    return KernelCode(
        load_bits=_widest(re.findall(r"ld\.global[.\w]*", ptx)),
        store_bits=_widest(re.findall(r"st\.global[.\w]*", ptx)),
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        spill_bytes=int(re.search(r"LOCAL:(\d+)", usage).group(1)),
        instructions=len(instructions),
    )


def _widest(accesses: list[str]) -> int:
    """Bits of the widest access among PTX ``ld``/``st`` forms like ``ld.global.v4.b32``."""
    widest = 0
    for access in accesses:
        lanes = re.search(r"\.v(\d)", access)
        bits = re.search(r"\.[bfsu](\d+)$", access)
        widest = max(widest, (int(lanes.group(1)) if lanes else 1) * int(bits.group(1)))
    return widest


def inspect_all(configs: Callable[[str], object], arch: int = 90) -> list[dict]:
    """One row per kind, direction and dtype, compiled with ``configs(dtype)``."""
    from xielu.fused.triton_kernels import KINDS

    rows = []
    for dtype in DTYPES:
        config = configs(dtype)
        for kind in KINDS:
            for direction in PASSES:
                code = read_code(compile_kernel(direction, kind, dtype, config, arch))
                # the code of a program that walks several blocks holds a loop, whether or not
                # unrolled: its static length is not what runs per block
                looped = direction == "backward" and config.blocks_per_program > 1
                per_element = code.instructions * config.warps * 32 / config.block
                rows.append(
                    {
                        "kind": kind,
                        "direction": direction,
                        "dtype": dtype,
                        "config": config,
                        "code": code,
                        "per_element": None if looped else per_element,
                    }
                )
    return rows


def budget(dtype: str, direction: str, args: argparse.Namespace) -> float:
    """SASS instructions per element that issue allows at ``args.bandwidth`` TB/s."""
    lanes_per_s = args.sms * 4 * args.clock_ghz * 1e9 * 32
    elements_per_s = args.bandwidth * 1e12 / (PASSES[direction] * DTYPES[dtype][1])
    return lanes_per_s / elements_per_s


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10")
    parser.add_argument("--block", type=int, help="override CONFIGS for every dtype")
    parser.add_argument("--warps", type=int)
    parser.add_argument("--blocks-per-program", type=int)
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--clock-ghz", type=float, default=1.98)
    parser.add_argument("--bandwidth", type=float, default=2.66, help="TB/s")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter compiles nothing")
    from xielu.fused import triton_kernels

    overrides = {"block": args.block, "warps": args.warps}
    overrides["blocks_per_program"] = args.blocks_per_program
    overrides = {k: v for k, v in overrides.items() if v is not None}

    def configs(dtype: str):
        return replace(triton_kernels.config_for(getattr(torch, dtype)), **overrides)

    rows = inspect_all(configs, args.arch)
    body = [
        [
            r["kind"],
            r["direction"],
            r["dtype"],
            f"{r['config'].block}/{r['config'].warps}/{r['config'].blocks_per_program}",
            str(r["code"].load_bits),
            str(r["code"].store_bits),
            str(r["code"].registers),
            str(r["code"].spill_bytes),
            "-" if r["per_element"] is None else f"{r['per_element']:.1f}",
            f"{budget(r['dtype'], r['direction'], args):.0f}",
        ]
        for r in rows
    ]
    header = ["kernel", "pass", "dtype", "shape", "load bits", "store bits", "registers"]
    header += ["spilled B", "SASS/element", "budget/element"]
    print(f"sm_{args.arch}; budget at {args.bandwidth} TB/s, {args.sms} SMs, {args.clock_ghz} GHz")
    print("\n".join(markdown(header, body)))
    return rows


if __name__ == "__main__":
    main()
