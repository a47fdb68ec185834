"""The gradient-design API: every activation's autograd derivative is its designed gradient."""

import math

import pytest
import torch

from xielu import (
    Alpha,
    BaseGradient,
    Branch,
    DesignedActivation,
    GradientDesign,
    available_activations,
    get_activation,
)
from xielu.bases import linear

EPS_BAND = 1e-5  # xIELU's expm1 is capped at eps = -1e-6: (eps, 0] has its own slope (see below)


def _designed(name: str) -> torch.nn.Module:
    """The activation's designed module (a gated one's gate), built inside the test that uses
    it: mutation testing maps a function to the tests that call it while they run, and a module
    built at collection would leave the bases' ``g`` and ``G`` mapped to no test here."""
    module = get_activation(name)
    return module.gate_activation if module.gated else module


def _perturbed(module: torch.nn.Module) -> torch.nn.Module:
    """Move trainable scalars away from their initial values so the check is not at one point."""
    module = module.double()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def _grid() -> torch.Tensor:
    x = torch.cat(
        [
            torch.linspace(-12, 12, 4001, dtype=torch.float64),
            torch.tensor([-3e-5, -2e-5, 2e-5, 1e-9, 1e-3, -1e-3], dtype=torch.float64),
        ]
    )
    return x[(x.abs() > EPS_BAND) | (x > 0)]


@pytest.mark.parametrize("name", available_activations())
def test_autograd_derivative_equals_designed_gradient(name):
    module = _perturbed(_designed(name))
    x = _grid().requires_grad_(True)
    (slope,) = torch.autograd.grad(module(x).sum(), x)
    expected = module.designed_gradient(x.detach())
    torch.testing.assert_close(slope, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", available_activations())
def test_every_activation_passes_through_the_origin_continuously(name):
    module = _perturbed(_designed(name))
    at = torch.tensor([0.0, 1e-12, -1e-12], dtype=torch.float64)
    y = module(at).detach()
    # 0 on both sides of the origin, up to xIELU's eps cap: f(0-) = alpha_n * expm1(-1e-6),
    # the paper's definition (pinned exactly in test_paper_formulas)
    assert y.abs().max() <= 5e-6


@pytest.mark.parametrize("name", available_activations())
def test_native_kernels_equal_their_integrated_design(name):
    """Baselines run torch's kernels; integrating their design must give the same function."""
    module = _perturbed(_designed(name))
    x = _grid()
    integrated = DesignedActivation.forward(module, x)
    torch.testing.assert_close(module(x).detach(), integrated.detach(), rtol=1e-9, atol=1e-9)


def test_user_design_subtracts_the_integration_constant():
    """A user design with G(0) != 0 and its own base: tanh-shaped negative slope."""
    tanh_base = BaseGradient("tanh", g=torch.tanh, G=lambda x: torch.log(torch.cosh(x)) + 5.0)
    design = GradientDesign(
        positive=Branch(linear(), Alpha(0.8, "softplus"), beta=0.5),
        negative=Branch(tanh_base, Alpha(0.6, "softplus"), beta=0.5),
    )
    act = DesignedActivation(design).double()
    x = torch.tensor([-2.0, -0.5, 0.0, 0.7], dtype=torch.float64, requires_grad=True)
    y = act(x)
    closed = [
        0.6 * math.log(math.cosh(-2.0)) - 1.0,
        0.6 * math.log(math.cosh(-0.5)) - 0.25,
        0.0,
        0.8 * 0.49 + 0.35,
    ]
    torch.testing.assert_close(y.detach(), torch.tensor(closed, dtype=torch.float64))
    (slope,) = torch.autograd.grad(y.sum(), x)
    expected = torch.tensor(
        [0.6 * math.tanh(-2.0) + 0.5, 0.6 * math.tanh(-0.5) + 0.5, 0.5, 1.6 * 0.7 + 0.5],
        dtype=torch.float64,
    )
    torch.testing.assert_close(slope, expected)
    assert set(dict(act.named_parameters())) == {"alpha_p", "alpha_n"}


def test_printing_an_activation_shows_the_gradient_it_integrates():
    """Each branch's ``alpha * g + beta`` with ``g`` by its base's name, then the trained values."""
    cubic = "x > 0: alpha_p*[3x^2] + 0.5, x <= 0: alpha_n*[e^x-1 (eps=-1e-06)] + 0.5"
    assert repr(get_activation("xielu_pos_cubic")) == (
        f"DesignedActivation({cubic}, alpha_p=0.8, alpha_n=0.8)"
    )
    assert repr(get_activation("relu2")) == (
        "NativeActivation(x > 0: 1*[2x] + 0, x <= 0: 0*[0] + 0)"
    )
    assert repr(get_activation("gelu_tanh")) == "NativeActivation(1*[GELU'-1/2 (tanh)] + 0.5)"
    assert repr(get_activation("xsilu")) == "XSiLU(alpha*[SiLU'-1/2] + 0.5, alpha=1.6)"
    assert "x <= 0: alpha_n*[e^x-1 (eps=-1e-06)] + beta" in repr(
        get_activation("xielu_trainable_beta")
    )


def test_whole_line_design_has_a_single_alpha():
    from xielu.bases import silu_centered

    act = DesignedActivation(GradientDesign(Branch(silu_centered(), Alpha(2.0, "softplus"), 0.5)))
    assert list(dict(act.named_parameters())) == ["alpha"]
    assert act.effective_scalars() == pytest.approx({"alpha": 2.0})


def test_trainable_beta_must_start_equal_on_both_branches():
    with pytest.raises(ValueError, match="beta_p and beta_n must be equal"):
        GradientDesign(
            Branch(linear(), Alpha(0.8), 0.5),
            Branch(linear(), Alpha(0.8), 0.0),
            trainable_beta=True,
        )


def test_alpha_init_below_its_softplus_floor_is_refused():
    with pytest.raises(ValueError, match="must exceed its softplus floor"):
        get_activation("xielu", alpha_n_init=0.4)  # alpha_n > beta = 0.5 is required


def test_unknown_constraint_is_refused():
    with pytest.raises(ValueError, match="choose one of: softplus, affine, fixed"):
        Alpha(0.8, "sigmoid")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", available_activations())
def test_outputs_and_gradients_are_finite_from_minus_to_plus_1e4(name, dtype):
    x = torch.linspace(-1e4, 1e4, 4001).to(dtype).requires_grad_(True)
    module = _designed(name).to(dtype)
    y = module(x)
    y.backward(torch.ones_like(y))
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters())
