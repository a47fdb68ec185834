"""Each activation against the paper's closed forms, evaluated independently in Python floats."""

import math

import pytest
import torch
import torch.nn.functional as F

from xielu import XIELU, XIPReLU, XSiLU, get_activation, inverse_softplus
from xielu.reference import ReferenceXIELU, xiprelu_reference

POINTS = [-30.0, -4.0, -1.0, -0.3, -1e-3, -2e-6, 0.0, 1e-7, 0.2, 1.0, 3.5, 25.0]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _xielu(x, ap=0.8, an=0.8, beta=0.5, eps=-1e-6):
    """Paper eq. 8, with the appendix's min(x, eps) inside expm1."""
    if x > 0:
        return ap * x * x + beta * x
    return an * math.expm1(min(x, eps)) - an * x + beta * x


def _xiprelu(x, ap=0.8, an=0.8, beta=0.5):
    """Paper eq. 18."""
    return (ap if x > 0 else an) * x * x + beta * x


def _evaluate(module, points=POINTS):
    x = torch.tensor(points, dtype=torch.float64)
    return module.double()(x).detach().tolist()


def _a(module) -> dict[str, float]:
    """Effective alphas as the module holds them (fp32 parameters round 0.8 to 0.8 +- 1e-8)."""
    return {k: float(v) for k, v in module.double().alpha_values().items()}


def test_xielu_matches_equation_8_in_float64():
    module = XIELU()
    a = _a(module)
    assert a == pytest.approx({"alpha_p": 0.8, "alpha_n": 0.8}, rel=1e-7)
    expected = [_xielu(x, a["alpha_p"], a["alpha_n"]) for x in POINTS]
    assert _evaluate(module) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_xielu_value_at_origin_is_alpha_n_expm1_eps():
    """The appendix code caps expm1's argument at eps, so f(0) = alpha_n * expm1(eps), not 0."""
    module = XIELU(alpha_n_init=1.7)
    y0 = _evaluate(module, [0.0])[0]
    assert y0 == pytest.approx(_a(module)["alpha_n"] * math.expm1(-1e-6), rel=1e-12)


def test_xielu_with_other_alphas_matches_equation_8():
    module = XIELU(alpha_p_init=0.3, alpha_n_init=2.5, beta=0.5)
    a = _a(module)
    expected = [_xielu(x, a["alpha_p"], a["alpha_n"]) for x in POINTS]
    assert _evaluate(module) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_xiprelu_matches_equation_18_in_float64():
    module = XIPReLU(alpha_p_init=1.1, alpha_n_init=0.4)
    a = _a(module)
    expected = [_xiprelu(x, a["alpha_p"], a["alpha_n"]) for x in POINTS]
    assert _evaluate(module) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_xielu_gradient_is_affine_elu_below_zero():
    """Paper eq. 5: slope alpha_n (e^x - 1) + beta for x < eps and 2 alpha_p x + beta above 0."""
    module = XIELU(alpha_p_init=0.6, alpha_n_init=1.4).double()
    ap, an = _a(module).values()
    x = torch.tensor([-5.0, -1.0, -0.01, 0.01, 2.0], dtype=torch.float64, requires_grad=True)
    (slope,) = torch.autograd.grad(module(x).sum(), x)
    expected = [an * math.expm1(v) + 0.5 if v < 0 else 2 * ap * v + 0.5 for v in x.tolist()]
    assert slope.tolist() == pytest.approx(expected, rel=1e-12)


def test_softplus_parametrisation_stores_the_appendix_raw_values():
    """Appendix A.3: a_p = log(exp(0.8) - 1), a_n = log(exp(0.8 - beta) - 1)."""
    module = XIELU()
    assert module.alpha_p.shape == (1,) and module.alpha_n.shape == (1,)
    assert module.alpha_p.item() == pytest.approx(math.log(math.exp(0.8) - 1), rel=1e-6)
    assert module.alpha_n.item() == pytest.approx(math.log(math.exp(0.3) - 1), rel=1e-6)
    assert module.effective_scalars() == pytest.approx({"alpha_p": 0.8, "alpha_n": 0.8})
    assert inverse_softplus(0.8) == pytest.approx(math.log(math.expm1(0.8)), rel=1e-14)


def test_xielu_equals_the_appendix_code_and_its_gradients():
    torch.manual_seed(0)
    x = torch.randn(4096, dtype=torch.float64) * 4
    ours, theirs = XIELU().double(), ReferenceXIELU().double()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-12, atol=1e-14)
    ga, gb = torch.randn_like(x), None
    gb = ga.clone()
    ya.backward(ga)
    yb.backward(gb)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.alpha_p.grad, theirs.alpha_p.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.alpha_n.grad, theirs.alpha_n.grad, rtol=1e-10, atol=1e-10)


def test_xiprelu_equals_the_appendix_code():
    module = XIPReLU(0.9, 0.2).double()
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    expected = xiprelu_reference(x, module.alpha_p, module.alpha_n)
    torch.testing.assert_close(module(x), expected)


def test_xsilu_matches_its_closed_form():
    """Paper eq. 4: xSiLU(x) = x (sigmoid(x)(1 + 2a) - a)."""
    module = XSiLU(alpha_init=0.45).double()
    a = module.alpha.item()
    assert a == pytest.approx(0.45, rel=1e-7)
    expected = [x * (_sigmoid(x) * (1 + 2 * a) - a) for x in POINTS]
    assert _evaluate(module) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "name,closed_form",
    [
        ("xielu_pos_cubic", lambda x, p, n: p * x**3 + 0.5 * x if x > 0 else _xielu(x, p, n)),
        # alpha_n is the branch scale 1 + 2a of xSiLU's a = 0.3
        (
            "xielu_neg_xsilu",
            lambda x, p, n: _xielu(x, p) if x > 0 else x * (_sigmoid(x) * n - (n - 1) / 2),
        ),
        ("xielu_neg_silu", lambda x, p, n: _xielu(x, p) if x > 0 else x * _sigmoid(x)),
        ("xielu_neg_zero", lambda x, p, n: _xielu(x, p) if x > 0 else 0.0),
        ("xielu_trainable_beta", lambda x, p, n: _xielu(x, p, n)),
        ("xiprelu_beta0", lambda x, p, n: (p if x > 0 else n) * x * x),
        ("xielu_beta1", lambda x, p, n: _xielu(x, p, n, beta=1.0)),
    ],
)
def test_each_ablation_row_matches_its_closed_form(name, closed_form):
    module = get_activation(name)
    a = _a(module)
    p, n = a["alpha_p"], a["alpha_n"]
    expected = [closed_form(x, p, n) for x in POINTS]
    assert _evaluate(module) == pytest.approx(expected, rel=1e-12, abs=1e-14)


def test_ablation_initial_alphas_are_the_documented_ones():
    inits = {
        "xielu_pos_cubic": (0.8, 0.8),
        "xielu_neg_xsilu": (0.8, 1.6),
        "xielu_neg_silu": (0.8, 1.0),
        "xielu_neg_zero": (0.8, 0.0),
        "xielu_trainable_beta": (0.8, 0.8),
        "xiprelu_beta0": (0.8, 0.8),
        "xielu_beta1": (0.8, 1.3),
    }
    for name, (p, n) in inits.items():
        a = _a(get_activation(name))
        assert (a["alpha_p"], a["alpha_n"]) == pytest.approx((p, n), rel=1e-6), name


def test_trainable_beta_is_one_parameter_shared_by_both_branches():
    module = get_activation("xielu_trainable_beta").double()
    assert module.beta.shape == (1,) and module.beta.requires_grad
    x = torch.tensor([-2.0, 3.0], dtype=torch.float64)
    module(x).sum().backward()
    # df/dbeta = x above 0; below, x + d(alpha_n)/d(beta) * (expm1(x) - x) with d alpha_n/d beta = 1
    expected = 3.0 + (-2.0 + math.expm1(-2.0) + 2.0)
    assert module.beta.grad.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name,gate", [("swiglu", F.silu), ("geglu", F.gelu), ("reglu", F.relu)])
def test_gated_activations_multiply_the_gate_by_up(name, gate):
    torch.manual_seed(0)
    g, u = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    torch.testing.assert_close(get_activation(name)(g, u), gate(g) * u)


def test_relu2_and_elu_match_their_definitions():
    assert _evaluate(get_activation("relu2")) == pytest.approx([max(x, 0) ** 2 for x in POINTS])
    expected = [x if x > 0 else math.expm1(x) for x in POINTS]
    assert _evaluate(get_activation("elu")) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_the_reference_xielu_at_and_around_eps_in_float64():
    """The appendix's xIELU evaluated where its cap acts, with every point built in float64
    (a point built in fp32 is not eps: -1e-6 there is -9.99999997e-7): at 0 the negative branch
    gives alpha_n expm1(eps); in (eps, 0] the capped term is constant; beta defaults to 0.5."""
    from xielu.reference import xielu_reference

    eps = -1e-6
    raw_p, raw_n = (
        torch.tensor([0.3], dtype=torch.float64),
        torch.tensor([-0.2], dtype=torch.float64),
    )
    an = 0.5 + math.log1p(math.exp(-0.2))
    fp32_eps = float(torch.tensor(eps, dtype=torch.float32))
    inside = (eps + fp32_eps) / 2  # between float64 eps and its fp32 rounding
    x = torch.tensor([0.0, eps, inside, math.nextafter(eps, 0.0), math.nextafter(eps, -1.0)])
    x = x.double()
    got = xielu_reference(x, raw_p, raw_n).tolist()
    for xi, yi in zip(x.tolist(), got, strict=True):
        expected = an * math.expm1(min(xi, eps)) - an * xi + 0.5 * xi
        assert yi == pytest.approx(expected, rel=1e-12, abs=0), xi
    assert got[0] == pytest.approx(an * math.expm1(eps), rel=1e-12)  # not the positive branch's 0


def test_the_reference_module_passes_its_own_eps_and_beta():
    from xielu.reference import xielu_reference

    module = ReferenceXIELU(eps=-0.5).double()
    x = torch.linspace(-2, 1, 31, dtype=torch.float64)
    want = xielu_reference(x, module.alpha_p, module.alpha_n, module.beta, -0.5)
    torch.testing.assert_close(module(x), want)
    assert not torch.allclose(module(x), xielu_reference(x, module.alpha_p, module.alpha_n))
