"""Triton kernels against the float64 reference.

Without a GPU they run through Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``,
set in conftest.py before the kernels are defined); with one, on CUDA tensors.
"""

import pytest
import torch

pytest.importorskip("triton")

from xielu.fused import formulas, triton_kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = triton_kernels.config_for(torch.float32).block
# The kernels compare x with eps in fp32; the float64 reference must use the same threshold, or
# the one input equal to fp32(-1e-6) falls on different sides of it.
EPS = float(torch.tensor(-1e-6, dtype=torch.float32))


def _tensor(shape, dtype, seed, transpose=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3
    if x.numel() > 8:
        x.view(-1)[:8] = torch.tensor([0.0, -1e-6, -5e-7, 1e-7, -0.49, -0.51, -25.0, 12.0])
    x = x.to(DEVICE, dtype)
    return x.transpose(0, 1) if transpose else x


CASES = [
    ((1,), False),
    ((BLOCK - 1,), False),
    ((BLOCK + 1,), False),
    ((3, BLOCK), False),
    ((7, 333), True),  # non-contiguous: a transposed view
    ((2, 5, 301), False),
]


def _reference(kind, x, grad, alpha_p, alpha_n, beta=0.5, eps=EPS):
    """float64 forward and backward of the same formulas."""
    x64, g64 = x.detach().double().cpu(), grad.detach().double().cpu()
    ap, an = alpha_p.double().cpu(), alpha_n.double().cpu()
    y = formulas.piecewise_forward(x64, ap, an, beta, eps, kind)
    return (y, *formulas.piecewise_backward(g64, x64, ap, an, beta, eps, kind))


@pytest.mark.parametrize("kind", ["xielu", "xiprelu"])
@pytest.mark.parametrize("shape,transpose", CASES, ids=[str(c) for c in CASES])
def test_triton_kernels_match_float64_reference_fp32(kind, shape, transpose):
    x = _tensor(shape, torch.float32, seed=len(shape) + shape[-1], transpose=transpose)
    grad = _tensor(x.shape, torch.float32, seed=99)
    alpha_p = torch.tensor([0.73], device=DEVICE)
    alpha_n = torch.tensor([1.21], device=DEVICE)
    y = triton_kernels.forward(x, alpha_p, alpha_n, 0.5, EPS, kind)
    dx, dap, dan = triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind)
    ry, rdx, rdap, rdan = _reference(kind, x, grad, alpha_p, alpha_n)
    assert y.shape == x.shape and dx.shape == x.shape
    torch.testing.assert_close(y.cpu().double(), ry, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(dx.cpu().double(), rdx, rtol=2e-6, atol=1e-6)
    # fp32 partial sums of fp32 products against exact sums
    scale = x.numel() ** 0.5
    torch.testing.assert_close(dap.cpu().double(), rdap, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(dan.cpu().double(), rdan, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("several_blocks", [False, True], ids=["default", "4-blocks"])
@pytest.mark.parametrize("kind", ["xielu", "xiprelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_kernels_compute_half_precision_in_fp32(kind, dtype, several_blocks):
    config = triton_kernels.KernelConfig(256, 2, 4) if several_blocks else None
    x = _tensor((5, 999), dtype, seed=3)
    grad = _tensor((5, 999), dtype, seed=4)
    alpha_p = torch.tensor([0.8], device=DEVICE)
    alpha_n = torch.tensor([0.8], device=DEVICE)
    y = triton_kernels.forward(x, alpha_p, alpha_n, 0.5, EPS, kind, config)
    dx, dap, dan = triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind, config)
    assert y.dtype == dtype and dx.dtype == dtype and dap.dtype == torch.float32
    ry, rdx, rdap, rdan = _reference(kind, x, grad, alpha_p, alpha_n)
    # one conversion of the fp32 result to the storage type: at most one ulp (2^-7 relative for
    # bf16, 2^-10 for fp16); a GPU rounds to nearest (half an ulp), the interpreter truncates
    rel = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    assert ((y.cpu().double() - ry).abs() <= rel * ry.abs() + 1e-6).all()
    assert ((dx.cpu().double() - rdx).abs() <= rel * rdx.abs() + 1e-6).all()
    torch.testing.assert_close(dap.cpu().double(), rdap, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(dan.cpu().double(), rdan, rtol=1e-5, atol=1e-3)


def test_triton_expm1_is_accurate_near_zero():
    """The kernel's own expm1 must not cancel: relative error at fp32 rounding level."""
    x = -torch.logspace(-7, 1.5, 400, dtype=torch.float64)
    alpha = torch.tensor([1.0], device=DEVICE)
    # with alpha_n = 1, beta = 0 the negative branch is expm1(min(x, eps)) - x; add x back
    y = triton_kernels.forward(x.float().to(DEVICE), alpha, alpha, 0.0, 0.0, "xielu").cpu().double()
    got = y + x.float().double()
    want = torch.expm1(x.float().double())
    assert ((got - want).abs() / want.abs()).max() < 1e-5


def test_alpha_gradients_are_deterministic():
    x = _tensor((4, 5000), torch.float32, seed=11)
    grad = _tensor((4, 5000), torch.float32, seed=12)
    alpha = torch.tensor([0.8], device=DEVICE)
    first = triton_kernels.backward(grad, x, alpha, alpha, 0.5, EPS, "xielu")
    second = triton_kernels.backward(grad, x, alpha, alpha, 0.5, EPS, "xielu")
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_module_runs_on_the_triton_backend_end_to_end():
    from xielu import XIELU

    module = XIELU(backend="triton").to(DEVICE)
    reference = XIELU(backend="eager", fused=False).to(DEVICE)
    x = _tensor((3, 700), torch.float32, seed=5).requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    module(x).sum().backward()
    reference(xr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(module.alpha_n.grad, reference.alpha_n.grad, rtol=1e-5, atol=1e-4)


# Launch shapes a tuning run may choose: several blocks per program, with programs whose last
# steps run past the end of the tensor; the partials then need more than one reduction step.
CONFIGS = [
    triton_kernels.KernelConfig(block=128, warps=2, blocks_per_program=3),
    triton_kernels.KernelConfig(block=64, warps=1, blocks_per_program=16),
    triton_kernels.KernelConfig(block=32, warps=1, blocks_per_program=1),
]


@pytest.mark.parametrize("kind", ["xielu", "xiprelu"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.slow
def test_every_launch_shape_computes_the_same_function(kind, config):
    x = _tensor((5, 3001), torch.float32, seed=21)  # 15005: no shape divides it
    grad = _tensor((5, 3001), torch.float32, seed=22)
    alpha_p = torch.tensor([0.6], device=DEVICE)
    alpha_n = torch.tensor([1.3], device=DEVICE)
    y = triton_kernels.forward(x, alpha_p, alpha_n, 0.5, EPS, kind, config)
    dx, dap, dan = triton_kernels.backward(grad, x, alpha_p, alpha_n, 0.5, EPS, kind, config)
    ry, rdx, rdap, rdan = _reference(kind, x, grad, alpha_p, alpha_n)
    torch.testing.assert_close(y.cpu().double(), ry, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(dx.cpu().double(), rdx, rtol=2e-6, atol=1e-6)
    scale = x.numel() ** 0.5
    torch.testing.assert_close(dap.cpu().double(), rdap, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(dan.cpu().double(), rdan, rtol=1e-5, atol=1e-5 * scale)


def test_an_empty_input_has_zero_alpha_gradients():
    x = torch.empty(0, 7, device=DEVICE)
    alpha = torch.tensor([0.8], device=DEVICE)
    dx, dap, dan = triton_kernels.backward(x, x, alpha, alpha, 0.5, EPS, "xielu")
    assert dx.shape == x.shape
    assert dap.item() == 0.0 and dan.item() == 0.0


@pytest.mark.parametrize("field,value", [("block", 1000), ("warps", 3), ("blocks_per_program", 0)])
def test_kernel_config_rejects_impossible_launch_shapes(field, value):
    with pytest.raises(ValueError, match=field):
        triton_kernels.KernelConfig(**{field: value})


@pytest.mark.parametrize("kind", ["xielu", "xiprelu"])
def test_a_nan_input_gives_nan_output_and_slope_and_nothing_else(kind):
    """As formulas.py: NaN in, NaN out and NaN dx; the neighbours are untouched. (Through the
    interpreter any min keeps NaN; on a GPU this needs the NaN-propagating min.)"""
    x = torch.tensor([1.5, float("nan"), -2.0, -1e-7, 0.0], device=DEVICE)
    grad = torch.ones_like(x)
    alpha = torch.tensor([0.8], device=DEVICE)
    y = triton_kernels.forward(x, alpha, alpha, 0.5, EPS, kind)
    dx, _, dan = triton_kernels.backward(grad, x, alpha, alpha, 0.5, EPS, kind)
    nan = torch.tensor([False, True, False, False, False], device=DEVICE)
    assert torch.equal(y.isnan(), nan) and torch.equal(dx.isnan(), nan)
    assert dan.isnan().all()  # the NaN element is on the negative side of the comparison


def _layouts():
    """Dense inputs in other memory orders, and one with gaps (a slice)."""
    base = _tensor((2, 6, 5, 7), torch.float32, seed=31)
    return {
        "transposed": base[0].transpose(0, 2),
        "permuted": base.permute(0, 2, 3, 1),
        "channels_last": base.contiguous(memory_format=torch.channels_last),
        "sliced": base[:, ::2],
    }


@pytest.mark.parametrize("layout", ["transposed", "permuted", "channels_last", "sliced"])
@pytest.mark.parametrize("kind", ["xielu", "xiprelu"])
def test_the_kernels_outputs_have_the_strides_the_fake_implementation_promises(kind, layout):
    """``torch.compile`` plans memory from the fake kernel (``empty_like(x)``): a real kernel
    returning another layout fails its stride assertion. opcheck compares the two."""
    from xielu.fused import ops

    x = _layouts()[layout].requires_grad_(True)
    op = ops._xielu_op if kind == "xielu" else ops._xiprelu_op
    alpha_p = torch.tensor([0.73], device=DEVICE, requires_grad=True)
    alpha_n = torch.tensor([1.21], device=DEVICE, requires_grad=True)
    args = (x, alpha_p, alpha_n, 0.5, EPS if kind == "xielu" else 0.0, "triton")
    torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_autograd_registration"))
    y = op(*args)
    assert y.stride() == torch.empty_like(x).stride()
    ry, rdx, _, _ = _reference(kind, x, torch.ones_like(x), alpha_p, alpha_n)
    torch.testing.assert_close(y.detach().cpu().double(), ry, rtol=2e-6, atol=1e-6)
    grad = _tensor(x.shape, torch.float32, seed=32)  # contiguous, unlike x
    dx, _, _ = triton_kernels.backward(grad, x.detach(), alpha_p, alpha_n, 0.5, EPS, kind)
    assert dx.stride() == torch.empty_like(x).stride()
    _, rdx, _, _ = _reference(kind, x, grad, alpha_p, alpha_n)
    torch.testing.assert_close(dx.cpu().double(), rdx, rtol=2e-6, atol=1e-6)


@pytest.mark.slow
def test_a_compiled_channels_last_convolution_feeds_the_triton_activation():
    from xielu import XIELU

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).to(DEVICE).to(memory_format=torch.channels_last)
    model = torch.nn.Sequential(conv, XIELU(backend="triton").to(DEVICE))
    reference = torch.nn.Sequential(conv, XIELU(backend="eager", fused=False).to(DEVICE))
    x = torch.randn(2, 3, 9, 9, device=DEVICE).contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(x), reference(x), rtol=2e-6, atol=1e-6)
    transposed = torch.compile(lambda t: model[1](t.transpose(1, 3)))
    torch.testing.assert_close(transposed(x), reference[1](x.transpose(1, 3)), rtol=2e-6, atol=1e-6)


def test_float64_never_reaches_the_fp32_triton_kernels(monkeypatch):
    """On CUDA, auto picks Triton for every other dtype; float64 would come back computed in
    fp32 (about 1e-7 off), so it takes the torch formulas, and asking for Triton is an error."""
    from xielu.fused import ops

    monkeypatch.delenv("XIELU_BACKEND", raising=False)
    cuda = torch.device("cuda")
    assert ops.resolve_backend("auto", cuda, torch.float32) == "triton"
    assert ops.resolve_backend("auto", cuda, torch.bfloat16) == "triton"
    assert ops.resolve_backend("auto", cuda, torch.float64) == "eager"
    with pytest.raises(ValueError, match="computes in fp32; float64 input needs"):
        ops.resolve_backend("triton", cuda, torch.float64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA routing needs a GPU")
def test_gradcheck_passes_on_cuda_with_the_default_backend():
    from xielu import XIELU

    module = XIELU().to("cuda").double()
    x = torch.randn(64, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))
