"""What the Triton kernels compile to for a Hopper GPU (sm_90), checked on a CPU.

Triton compiles ahead of time with the CUDA tools its Linux wheel ships
(``scripts/bench/inspect_kernels.py``), so the properties that decide a pointwise kernel's speed on
a GPU are facts here: 128-bit vector loads and stores, no register spills, and few enough
instructions per element that memory, not instruction issue, bounds the kernel.
"""

import json
import os
import subprocess
import sys

import pytest

from train_helpers import ROOT

pytest.importorskip("triton")
# one worker compiles the kernels once for the whole module (its fixture takes ~10 s)
pytestmark = pytest.mark.xdist_group("kernel_code")

PROBE = """
import dataclasses
import json
import torch
from scripts.bench.inspect_kernels import budget, inspect_all
from xielu.fused.triton_kernels import config_for
import argparse
limits = argparse.Namespace(sms=132, clock_ghz=1.98, bandwidth=2.66)
rows = inspect_all(lambda dtype: config_for(getattr(torch, dtype)))
print(json.dumps([
    {**{k: r[k] for k in ("kind", "direction", "dtype", "per_element")},
     **dataclasses.asdict(r["code"]), "budget": budget(r["dtype"], r["direction"], limits)}
    for r in rows
]))
"""

# the min instructions of xIELU's kernels, in PTX (the exponent is capped at eps with a min)
MINIMA = """
import re
from scripts.bench.inspect_kernels import compile_kernel
from xielu.fused.triton_kernels import KernelConfig
for direction in ("forward", "backward"):
    ptx = compile_kernel(direction, "xielu", "bfloat16", KernelConfig())["ptx"]
    print(direction, *sorted(set(re.findall(r"\\bmin\\.[.\\w]*", ptx))))
"""


def _compile_for_sm90(program: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile for real
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode and "CUDA tools" in out.stderr + out.stdout:
        pytest.skip("this triton wheel ships no ptxas/cuobjdump")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def kernels():
    return json.loads(_compile_for_sm90(PROBE).strip().splitlines()[-1])


@pytest.mark.slow
def test_every_kernel_moves_memory_in_128_bit_vectors(kernels):
    assert len(kernels) == 8  # xielu, xiprelu x forward, backward x bf16, fp32
    for k in kernels:
        assert (k["load_bits"], k["store_bits"]) == (128, 128), k


@pytest.mark.slow
def test_no_kernel_spills_registers_or_limits_occupancy(kernels):
    for k in kernels:
        assert k["spill_bytes"] == 0, k
        # 65536 registers per SM: at most 128 per thread keeps 512 threads resident, the least
        # a streaming kernel can usually still fill the memory pipe with
        assert k["registers"] <= 128, k


@pytest.mark.slow
def test_instructions_per_element_stay_within_what_the_bandwidth_allows(kernels):
    """At the bandwidth compiled ReLU² reached on an H100, an element's bytes allow ~50 (bf16
    forward) to ~150 (fp32 backward) issued instructions; past that, issue bounds the kernel."""
    counted = [k for k in kernels if k["per_element"] is not None]  # programs without a loop
    assert counted
    for k in counted:
        assert k["per_element"] < 0.75 * k["budget"], k


@pytest.mark.slow
def test_xielu_caps_the_exponent_with_a_min_that_keeps_nan():
    """A GPU's plain min returns the non-NaN operand (IEEE minNum): min(NaN, eps) = eps would
    give a NaN input a finite slope. Triton's interpreter (numpy) keeps the NaN either way, so
    only the compiled code can show which min the kernels use."""
    lines = _compile_for_sm90(MINIMA).strip().splitlines()[-2:]
    assert lines == ["forward min.NaN.f32", "backward min.NaN.f32"]
