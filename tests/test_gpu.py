"""Checks that only mean something on a CUDA GPU: the real Triton kernels at scale, bf16 steps.

Run them with ``bash scripts/gpu_checks.sh`` (or ``python -m pytest -m gpu``); without CUDA they
are skipped. ``tests/test_triton.py`` also runs its kernel tests on CUDA when a GPU is present.
"""

import pytest
import torch

from xielu.fused import formulas

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EPS = float(torch.tensor(-1e-6, dtype=torch.float32))


def _float64_reference(kind, x, grad, alpha_p, alpha_n):
    x64, g64 = x.double(), grad.double()
    ap, an = alpha_p.double(), alpha_n.double()
    y = formulas.piecewise_forward(x64, ap, an, 0.5, EPS, kind)
    return (y, *formulas.piecewise_backward(g64, x64, ap, an, 0.5, EPS, kind))


@pytest.mark.parametrize("several_blocks", [False, True], ids=["default", "16-blocks"])
@pytest.mark.parametrize("kind", ["xielu", "xiprelu"])
def test_kernels_are_right_past_two_to_the_31_elements(kind, several_blocks):
    """Offsets are 64-bit: elements beyond index 2^31 are computed, and computed right, also
    when backward programs walk several blocks (a launch shape tune_kernels may choose)."""
    from xielu.fused import triton_kernels

    config = triton_kernels.KernelConfig(1024, 4, 16) if several_blocks else None

    n = 2**31 + 4099
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    x.normal_(0.0, 3.0, generator=torch.Generator("cuda").manual_seed(0))
    grad = torch.ones_like(x)
    alpha_p = torch.tensor([0.7], device="cuda")
    alpha_n = torch.tensor([1.1], device="cuda")
    y = triton_kernels.forward(x, alpha_p, alpha_n, 0.5, EPS, kind, config)
    dx, _, _ = triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind, config)
    for start in (0, 2**31 - 2048, n - 4096):  # the head, across 2^31, the tail
        part = slice(start, start + 4096)
        ry, rdx, _, _ = _float64_reference(kind, x[part], grad[part], alpha_p, alpha_n)
        torch.testing.assert_close(y[part].double(), ry, rtol=2**-8, atol=1e-6)
        torch.testing.assert_close(dx[part].double(), rdx, rtol=2**-8, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alpha_gradients_are_bit_identical_across_runs_at_training_size(dtype):
    from xielu.fused import triton_kernels

    gen = torch.Generator("cuda").manual_seed(1)
    x = torch.randn(5, 4096, 9216, device="cuda", generator=gen).to(dtype)
    grad = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    alpha = torch.tensor([0.8], device="cuda")
    runs = [triton_kernels.backward(grad, x, alpha, alpha, 0.5, EPS, "xielu") for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["xielu", "xiprelu"])
def test_compiled_module_equals_the_op_it_wraps(name):
    from xielu import get_activation

    module = get_activation(name).cuda()
    twin = get_activation(name).cuda()
    twin.load_state_dict(module.state_dict())
    compiled = torch.compile(twin)  # its state_dict keys carry a prefix: load the twin first
    x = torch.randn(4, 2048, 1536, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xc = x.detach().clone().requires_grad_(True)
    module(x).float().square().sum().backward()
    compiled(xc).float().square().sum().backward()
    torch.testing.assert_close(xc.grad, x.grad, rtol=0, atol=0)
    torch.testing.assert_close(twin.alpha_p.grad, module.alpha_p.grad)


def test_a_bf16_training_step_on_the_gpu_matches_fp32():
    """The loss and every parameter's gradient (the activation scalars' included) of a bf16
    compiled step against an fp32 eager one: bf16 rounds matmul inputs (~4e-3 relative), so a
    gradient that went wrong (a dropped term, a bf16 sum) shows as a large relative error."""
    from model import Llama, ModelConfig
    from training.runtime.distributed import Env
    from training.runtime.parallelize import ParallelConfig, parallelize

    config = ModelConfig(
        vocab_size=1024, dim=256, n_layers=2, n_heads=4, gated_hidden=512, max_seq_len=256
    )
    env = Env(0, 1, 0, torch.device("cuda", 0))
    tokens = torch.randint(0, 1024, (4, 257), device="cuda")
    losses, grads = {}, {}
    for bf16, compile_scope in ((False, "none"), (True, "blocks")):
        torch.manual_seed(0)
        bare = Llama(config).cuda()
        model = parallelize(
            bare, env, ParallelConfig(precision="bf16" if bf16 else "fp32", compile=compile_scope)
        )
        with model.autocast():
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses[bf16] = float(loss)
        # by position: compiling blocks may rename parameters (_orig_mod), not reorder them
        grads[bf16] = [(name, p.grad.float()) for name, p in bare.named_parameters()]
    assert losses[True] == pytest.approx(losses[False], rel=1e-2)
    assert len(grads[True]) == len(grads[False])
    for (name, want), (_, got) in zip(grads[False], grads[True], strict=True):
        error = (got - want).norm() / want.norm()
        assert error < 5e-2, (name, float(error))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_bf16_lm_head_gradients_match_float64(compiled):
    """The loss's GEMMs in bf16, its softmax in fp32 (through Inductor when compiled)."""
    from model.loss import linear_cross_entropy

    torch._dynamo.reset()
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(8192, 512, device="cuda", generator=gen).bfloat16().float()
    weight = (0.05 * torch.randn(32768, 512, device="cuda", generator=gen)).bfloat16().float()
    targets = torch.randint(0, 32768, (8192,), device="cuda", generator=gen)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, targets, chunk_size=1024, compiled=compiled)
    loss.backward()
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(h64 @ w64.t(), targets)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-4)
    for got, want in ((hidden.grad, h64.grad), (weight.grad, w64.grad)):
        error = (got.double() - want).norm() / want.norm()
        assert error < 1e-2, error  # bf16 d loss/d logits and chunk products (2^-9 relative)
