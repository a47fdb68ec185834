"""Every modified activation of the paper's ablation table (Table 4), as a gradient design.

Where the paper leaves a detail open, the choice is made here and said in the docstring. All
alphas start from the paper's 0.8 unless noted, and beta is 0.5 unless the row changes it.
"""

from __future__ import annotations

from xielu import bases
from xielu.activations import XIELU, XIPReLU, xielu_design
from xielu.design import Branch, DesignedActivation, GradientDesign
from xielu.parametrize import Alpha


def _xielu_positive(alpha_p_init: float, beta: float = 0.5) -> Branch:
    return Branch(bases.linear(), Alpha(alpha_p_init, "softplus"), beta)


def _xielu_negative(alpha_n_init: float, eps: float, beta: float = 0.5) -> Branch:
    return Branch(bases.elu(eps), Alpha(alpha_n_init, "softplus", above_beta=True), beta)


def xielu_positive_cubic(
    alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, eps: float = -1e-6
) -> DesignedActivation:
    """ "Positive component x³": slope 3 alpha_p x² + beta above zero, so alpha_p x³ + beta x."""
    positive = Branch(bases.quadratic(), Alpha(alpha_p_init, "softplus"), 0.5)
    return DesignedActivation(GradientDesign(positive, _xielu_negative(alpha_n_init, eps)))


def xielu_negative_xsilu(
    alpha_p_init: float = 0.8, alpha_n_init: float = 0.3
) -> DesignedActivation:
    """ "Negative component xSiLU": xSiLU(x) = x (sigmoid(x)(1 + 2a) - a) for x <= 0.

    Its slope at 0 is 1/2 = beta, so the two branches join with a continuous gradient. ``alpha_n``
    is xSiLU's a (unconstrained); a = 0.3 matches xIELU's initial slope limit -0.3.
    """
    negative = Branch(
        bases.silu_centered(), Alpha(1 + 2 * alpha_n_init, "affine", offset=1.0, scale=2.0), 0.5
    )
    return DesignedActivation(GradientDesign(_xielu_positive(alpha_p_init), negative))


def xielu_negative_silu(alpha_p_init: float = 0.8) -> DesignedActivation:
    """ "Negative component SiLU": the fixed SiLU below zero (slope SiLU'(x), 1/2 at 0)."""
    negative = Branch(bases.silu_centered(), Alpha(1.0, "fixed"), 0.5)
    return DesignedActivation(GradientDesign(_xielu_positive(alpha_p_init), negative))


def xielu_negative_zero(alpha_p_init: float = 0.8) -> DesignedActivation:
    """ "Negative component set to 0": alpha_p x² + beta x above zero, exactly 0 below."""
    negative = Branch(bases.zero(), Alpha(0.0, "fixed"), 0.0)
    return DesignedActivation(GradientDesign(_xielu_positive(alpha_p_init), negative))


def xielu_trainable_beta(
    alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5, eps: float = -1e-6
) -> DesignedActivation:
    """ "Trainable beta_p = beta_n": one shared beta parameter, initialised at 0.5.

    alpha_n stays constrained above the (now moving) beta: alpha_n = beta + softplus(a_n).
    """
    return DesignedActivation(
        xielu_design(alpha_p_init, alpha_n_init, beta, eps, trainable_beta=True)
    )


def xiprelu_beta0(alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, **kwargs) -> XIPReLU:
    """ "xIPReLU, fixed beta_p = beta_n = 0": alpha x² on both sides."""
    return XIPReLU(alpha_p_init, alpha_n_init, beta=0.0, **kwargs)


def xielu_beta1(
    alpha_p_init: float = 0.8, alpha_n_init: float = 1.3, eps: float = -1e-6, **kwargs
) -> XIELU:
    """ "xIELU, fixed beta_p = beta_n = 1".

    alpha_n must exceed beta, so the paper's 0.8 cannot be used; 1.3 keeps xIELU's default
    initial slope limit beta - alpha_n = -0.3.
    """
    return XIELU(alpha_p_init, alpha_n_init, beta=1.0, eps=eps, **kwargs)
