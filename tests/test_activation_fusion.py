"""Under FP8, the activation is computed inside the kernel that casts the down projection's input.

One block of the Llama is compiled by Inductor (C++ on this CPU, the same fusion decisions as on
a GPU) with its linear layers in emulated float8 tensorwise (torchao: the amax of each input,
its scale and its float8 cast are ordinary pointwise and reduction ops, and emulation only
changes the matmul), and its forward's generated code is read. ReLU² is the reference: Inductor
fuses it into the kernel that reduces the down projection's input to its amax and casts it to
float8, so the activation's output never goes through memory in bf16. xIELU and xIPReLU on
their ``traced`` path (``xielu.fused.ops.TracedPiecewise``) must be fused the same way; as the
opaque custom op they are not (that op is a call between kernels), which is what the traced
path is for (the speed it buys is measured on a GPU, docs/performance.md).
"""

from __future__ import annotations

import re

import pytest
import torch

from model import Llama, ModelConfig
from training.runtime import float8

pytest.importorskip("torchao")
pytestmark = pytest.mark.slow

KERNEL = re.compile(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\(.*?'''(.*?)'''", re.S)
# an op of each activation's formula that nothing else in the block computes, as Inductor
# names it in a fused kernel's name: xIELU's expm1, xIPReLU's select between its two branches
# (the block's other kernels have no where), ReLU²'s relu
FORMULA = {"xielu": "expm1", "xiprelu": "where", "relu2": "relu"}


def forward_kernels(activation: str, **kwargs) -> dict[str, str]:
    """{kernel name: C++ source} of one compiled block's forward, float8 tensorwise, bf16."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    model_config = ModelConfig(
        vocab_size=128, dim=64, n_layers=1, n_heads=2, gated_hidden=128, mlp_hidden=256,
        max_seq_len=32, activation=activation, activation_kwargs=kwargs,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Llama(model_config)
    float8.convert(model, "tensorwise", keep=("lm_head",), auto_filter=False, emulate=True)
    block = torch.compile(model.layers[0])
    x = torch.randn(2, 32, 64, requires_grad=True)
    cos, sin = model.rope_cos[:32], model.rope_sin[:32]

    def forward():
        with torch.autocast("cpu", torch.bfloat16):
            return block(x, cos, sin)

    torch._dynamo.reset()
    with config.patch(fx_graph_cache=False):  # a cached graph would hand back no code
        _, code = run_and_get_code(forward)
    torch._dynamo.reset()
    return dict(KERNEL.findall("\n".join(code)))


def fused_with_the_cast(kernels: dict[str, str], activation: str) -> list[str]:
    """The kernels that compute the activation's formula, the amax (abs, then a max
    reduction) and the float8 cast, all three."""
    return [
        name
        for name, source in kernels.items()
        if FORMULA[activation] in name.split("_")
        and "Float8_e4m3fn" in source
        and "abs" in name
        and "max_propagate_nan" in source
    ]


def test_relu2_is_computed_in_the_kernel_that_casts_the_down_projection_s_input():
    kernels = forward_kernels("relu2")
    assert len(fused_with_the_cast(kernels, "relu2")) == 1, list(kernels)


@pytest.mark.parametrize("activation", ["xielu", "xiprelu"])
def test_the_traced_path_is_fused_like_relu2(activation):
    kernels = forward_kernels(activation, backend="traced")
    assert len(fused_with_the_cast(kernels, activation)) == 1, list(kernels)


def test_the_custom_op_is_not_fused_which_is_why_the_traced_path_exists():
    kernels = forward_kernels("xielu", backend="eager")
    assert fused_with_the_cast(kernels, "xielu") == []
    assert not any("expm1" in name for name in kernels), list(kernels)
