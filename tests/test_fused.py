"""The fused xIELU/xIPReLU ops: same function and gradients as autograd, lean, stable, portable."""

import io
import math

import pytest
import torch

from xielu import XIELU, XIPReLU
from xielu.fused import formulas, ops

KINDS = {"xielu": XIELU, "xiprelu": XIPReLU}
# the custom op (``auto``: its eager kernels here, tests/conftest.py) and the traced
# autograd function that torch.compile fuses into its neighbours: the same numbers
BACKENDS = ["auto", "traced"]


def _inputs(n: int = 6000, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    # the (eps, 0] band, eps itself, and exact zeros: where the capped expm1 changes the slope
    special = torch.tensor([0.0, -0.0, -1e-6, -5e-7, -1e-7, -1.0000001e-6, 1e-8, -80.0, 60.0])
    return torch.cat([special.double(), x]).to(dtype)


def _pair(cls, backend: str = "auto", **kwargs):
    """A fused module and an unfused one (generic autograd path) with identical parameters."""
    fused = cls(**kwargs, fused=True, backend=backend).double()
    plain = cls(**kwargs, fused=False).double()
    with torch.no_grad():
        fused.alpha_p.add_(0.17)
        fused.alpha_n.sub_(0.11)
    plain.load_state_dict(fused.state_dict())
    return fused, plain


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_fused_backward_equals_autograd_of_the_formula_everywhere(kind, backend):
    fused, plain = _pair(KINDS[kind], backend)
    x = _inputs()
    grad = torch.randn_like(x)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = fused(xa), plain(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-13, atol=1e-13)
    ya.backward(grad)
    yb.backward(grad)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-13, atol=1e-13)
    for name in ("alpha_p", "alpha_n"):
        torch.testing.assert_close(
            getattr(fused, name).grad, getattr(plain, name).grad, rtol=1e-11, atol=1e-11
        )


def test_xielu_slope_inside_the_eps_band_is_beta_minus_alpha_n():
    """Autograd of the paper's code: expm1(min(x, eps)) is flat in (eps, 0]."""
    module = XIELU(alpha_n_init=1.2).double()
    x = torch.tensor([-5e-7, 0.0], dtype=torch.float64, requires_grad=True)
    module(x).sum().backward()
    alpha_n = module.effective_scalars()["alpha_n"]
    assert x.grad.tolist() == pytest.approx([0.5 - alpha_n] * 2, rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_in_float64(kind, backend):
    module = KINDS[kind](alpha_p_init=0.7, alpha_n_init=1.1, backend=backend).double()
    x = torch.cat([torch.linspace(-4, -0.01, 9), torch.linspace(0.01, 4, 9)]).double()
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda inp, ap, an: module._fused_call(inp, ap, an),
        (
            x,
            torch.tensor([0.7], dtype=torch.float64, requires_grad=True),
            torch.tensor([1.1], dtype=torch.float64, requires_grad=True),
        ),
    )
    assert torch.autograd.gradcheck(lambda inp: module(inp), (x,))


@pytest.mark.parametrize("op", [ops._xielu_op, ops._xiprelu_op], ids=["xielu", "xiprelu"])
@pytest.mark.slow
@pytest.mark.mutation
def test_custom_op_registration_passes_opcheck(op):
    """Schema, fake (meta) kernel, and autograd registration, as torch.compile relies on them."""
    x = torch.randn(3, 17, dtype=torch.float32, requires_grad=True)
    alpha_p = torch.tensor([0.8], requires_grad=True)
    alpha_n = torch.tensor([0.9], requires_grad=True)
    torch.library.opcheck(op, (x, alpha_p, alpha_n, 0.5, -1e-6, "eager"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_only_the_input_is_saved_for_backward(kind, backend):
    module = KINDS[kind](backend=backend)
    x = torch.randn(64, 512, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        module(x)
    big = [t for t in saved if t.numel() > 1]
    assert len(big) == 1 and big[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", KINDS)
def test_outputs_and_gradients_stay_finite_over_a_wide_range(kind, dtype):
    module = KINDS[kind]()
    x = torch.linspace(-1e4, 1e4, 20001).to(dtype).requires_grad_(True)
    y = module(x)
    y.backward(torch.ones_like(y))
    assert y.dtype == dtype and x.grad.dtype == dtype
    assert torch.isfinite(x.grad).all()
    # fp16 cannot hold 0.8 * (1e4)² (max 65504): there, and only there, the output is inf
    exact = KINDS[kind](fused=False).double()(x.detach().double()).detach()
    representable = exact.abs() < torch.finfo(dtype).max
    assert torch.isfinite(y[representable]).all()
    assert torch.isinf(y[~representable]).all()
    assert module.alpha_p.grad.dtype == torch.float32
    assert torch.isfinite(module.alpha_p.grad).all() and torch.isfinite(module.alpha_n.grad).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_nan_propagates_through_forward_and_backward(kind, backend):
    """Stricter than autograd of xIELU's formula, whose clamp would give dx = beta - alpha_n."""
    module = KINDS[kind](backend=backend)
    x = torch.tensor([1.0, float("nan"), -1.0], requires_grad=True)
    y = module(x)
    y.sum().backward()
    assert torch.isnan(y[1]) and not torch.isnan(y[[0, 2]]).any()
    assert torch.isnan(x.grad[1]) and not torch.isnan(x.grad[[0, 2]]).any()
    assert torch.isnan(module.alpha_p.grad).any() or torch.isnan(module.alpha_n.grad).any()


# bf16 stores 8 significant bits: rounding the fp32 result costs at most 2^-8 relative.
BF16_RTOL = 2.0**-8


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_bf16_results_are_within_one_bf16_rounding_of_float64(kind, backend):
    module = KINDS[kind](backend=backend)
    x16 = (torch.randn(20000) * 4).to(torch.bfloat16).requires_grad_(True)
    x64 = x16.detach().double().requires_grad_(True)
    reference = KINDS[kind](fused=False).double()
    reference.load_state_dict(module.state_dict())
    y16, y64 = module(x16), reference(x64)
    scale = y64.detach().abs() + 1e-3
    assert ((y16.double() - y64).abs() / scale).max() <= BF16_RTOL
    grad = torch.randn(20000).to(torch.bfloat16)
    y16.backward(grad)
    y64.backward(grad.double())
    gscale = x64.grad.abs() + 1e-3
    assert ((x16.grad.double() - x64.grad).abs() / gscale).max() <= BF16_RTOL
    # alpha gradients are fp32 sums of fp32 products: close to the fp64 sums
    for name in ("alpha_p", "alpha_n"):
        ours, exact = getattr(module, name).grad.double(), getattr(reference, name).grad
        torch.testing.assert_close(ours, exact, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trip_keeps_the_function(kind):
    source = KINDS[kind](alpha_p_init=0.33, alpha_n_init=1.7)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = KINDS[kind]()
    target.load_state_dict(torch.load(buffer))
    x = torch.randn(100)
    torch.testing.assert_close(target(x), source(x))
    assert target.effective_scalars() == pytest.approx({"alpha_p": 0.33, "alpha_n": 1.7}, rel=1e-6)


def test_loading_a_checkpoint_with_another_beta_is_refused():
    state = XIELU(beta=1.0, alpha_n_init=1.3).state_dict()
    with pytest.raises(ValueError, match="construct it with beta=1"):
        XIELU().load_state_dict(state)


def test_state_dict_loads_into_hugging_face_xielu_activation():
    """Same parameter and buffer names and shapes as transformers' XIELUActivation."""
    transformers_activations = pytest.importorskip("transformers.activations")
    ours = XIELU(alpha_p_init=0.6, alpha_n_init=1.4)
    hf = transformers_activations.XIELUActivation(dtype=torch.float32)
    assert {k: v.shape for k, v in hf.state_dict().items()} == {
        k: v.shape for k, v in ours.state_dict().items()
    }
    hf.load_state_dict(ours.state_dict())
    x = torch.randn(1000) * 3
    torch.testing.assert_close(hf(x), ours(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_folded_inference_module_matches_and_has_no_parameters(kind):
    module = KINDS[kind](alpha_p_init=0.5, alpha_n_init=1.6)
    folded = module.fold()
    assert list(folded.parameters()) == []
    x = torch.randn(500) * 3
    torch.testing.assert_close(folded(x), module(x).detach())


def test_unknown_backend_is_refused_at_construction():
    with pytest.raises(ValueError, match="choose one of"):
        XIELU(backend="cuda-magic")


@pytest.fixture
def fresh_compiled_kernels(monkeypatch, fresh_dynamo):
    """The compiled CPU path as a new process sees it, whatever ran earlier in this one.

    ``ops`` keeps process-wide state: after one failed compile (a broken toolchain, or dynamo's
    recompile limit of 8 per function hit by earlier callers) ``ops._compile_failed`` sends every
    later "compiled" call to the eager kernel with a single warning, which would turn a
    compiled-against-eager comparison into eager against eager. Dynamo's caches are reset so that
    no earlier test's compilations count towards that limit.
    """
    monkeypatch.setattr(ops, "_compile_failed", False)
    monkeypatch.setattr(ops, "_over_recompile_limit", set())
    ops._compiled.cache_clear()
    yield
    ops._compiled.cache_clear()


# The alpha gradients are fp32 sums of ~6000 products that Inductor's vectorised loop adds in
# another order than ATen's sum. The two agree to a few roundings of the sum of the terms'
# magnitudes (at most 2.8 fp32 eps over 8000 random draws, both kinds, 256- and 512-bit SIMD),
# not of the result, which cancels: a relative tolerance on it failed about 4% of random draws.
SUM_ROUNDINGS = 8


@pytest.mark.slow
@pytest.mark.filterwarnings("error:xielu. compiling the CPU kernel failed")
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_cpu_kernels_equal_the_eager_kernels(kind, fresh_compiled_kernels):
    """The default CPU path: Inductor-generated loops for the same formulas."""
    if not ops.CPP_COMPILER_AVAILABLE:
        pytest.skip("Inductor's CPU code generation needs a C++ compiler")
    x = _inputs(dtype=torch.float32).requires_grad_(True)
    # a seeded generator: torch seeds the global one at random in every process
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for backend in ("compiled", "eager"):
        module = KINDS[kind](backend=backend)
        xb = x.detach().clone().requires_grad_(True)
        y = module(xb)
        y.backward(grad)
        results.append((y.detach(), xb.grad, module.alpha_p.grad, module.alpha_n.grad))
    assert not ops._compile_failed, "the compiled kernel fell back to the eager one"
    compiled, eager = results
    for got, want in zip(compiled[:2], eager[:2], strict=True):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-5)
    # sum |grad * term| per alpha: the alpha gradients for |grad| (each term is >= 0 or ~1e-6)
    one = torch.ones(1, dtype=torch.float64)
    magnitudes = formulas.piecewise_backward(
        grad.abs().double(), x.detach().double(), one, one, 0.5, -1e-6, kind
    )[1:]
    for got, want, size in zip(compiled[2:], eager[2:], magnitudes, strict=True):
        bound = SUM_ROUNDINGS * torch.finfo(torch.float32).eps * float(size.abs())
        torch.testing.assert_close(got, want, rtol=0, atol=bound)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_module_compiles_without_graph_breaks(backend):
    layer = torch.nn.Sequential(
        torch.nn.Linear(16, 32), XIELU(backend=backend), torch.nn.Linear(32, 16)
    )
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 16)
    compiled(x).sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    layer(x).sum().backward()
    for got, want in zip(grads, [p.grad for p in layer.parameters()], strict=True):
        torch.testing.assert_close(got, want)
    assert math.isfinite(float(layer[1].alpha_p.grad))


@pytest.mark.slow
def test_more_variants_than_the_recompile_limit_keep_compilation_on(
    fresh_compiled_kernels, monkeypatch
):
    """Dynamo's limit on variants of one function is not a broken toolchain: the variants past
    it run eager (one warning), and the CPU path stays compiled for everything else."""
    if not ops.CPP_COMPILER_AVAILABLE:
        pytest.skip("Inductor's CPU code generation needs a C++ compiler")
    x = torch.randn(64, generator=torch.Generator().manual_seed(2))
    alpha = torch.tensor([0.8])
    limit = torch._dynamo.config.recompile_limit
    with pytest.warns(UserWarning, match="recompile_limit") as caught:
        for i in range(limit + 3):  # eps is a compile-time constant: one variant each
            eps = -1e-6 * (i + 1)
            y = ops.xielu(x, alpha, alpha, 0.5, eps, backend="compiled")
            want = formulas.piecewise_forward(x, alpha, alpha, 0.5, eps, "xielu")
            torch.testing.assert_close(y, want, rtol=2e-6, atol=1e-6)
    assert sum("recompile_limit" in str(w.message) for w in caught) == 1
    assert not ops._compile_failed
    monkeypatch.delenv("XIELU_BACKEND", raising=False)  # the suite's default (conftest.py)
    assert ops.resolve_backend("auto", torch.device("cpu")) == "compiled"


@pytest.mark.slow
def test_importing_the_activations_and_the_model_does_not_import_dynamo():
    """Dynamo costs 2 s of import; a process that never compiles (evaluation, export, the
    eager kernels) should not pay it for the fused ops' recompile-limit exception."""
    import subprocess
    import sys

    code = "import sys, xielu, model; print('torch._dynamo' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_the_one_pass_backward_at_eps_itself_equals_autograd_in_float64():
    """The special points built in float64, so that x == eps exactly: there autograd of the
    clamp passes the gradient (slope alpha_n expm1(eps) + beta), just above eps the capped term
    is constant (slope beta - alpha_n). Points built in fp32 never hit eps (-9.99999997e-7)."""
    eps, beta = -1e-6, 0.5
    points = [eps, math.nextafter(eps, 0.0), math.nextafter(eps, -1.0), 0.0, -1.0, 1.0]
    x = torch.tensor(points, dtype=torch.float64, requires_grad=True)
    alpha_p = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    alpha_n = torch.tensor([1.1], dtype=torch.float64, requires_grad=True)
    grad = torch.linspace(0.5, 1.5, len(points), dtype=torch.float64)
    y = formulas.piecewise_forward(x, alpha_p, alpha_n, beta, eps, "xielu")
    want = torch.autograd.grad(y, (x, alpha_p, alpha_n), (grad,))
    scalars = (alpha_p.detach(), alpha_n.detach(), beta, eps, "xielu")
    got = formulas.piecewise_backward(grad, x.detach(), *scalars)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=0)
    assert float(got[0][0]) == pytest.approx(0.5 * (1.1 * math.expm1(eps) + beta), rel=1e-12)
