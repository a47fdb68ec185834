"""The activations xIELU is compared against: ReLU, ReLU², GELU, SiLU, ELU, xSiLU and GLUs.

Fixed baselines run torch's native kernels; each still carries the gradient design it
corresponds to (``alpha * g + beta`` with alpha fixed), which documents it in the paper's terms
and lets the tests check the native kernel against the integrated design.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from xielu import bases
from xielu.design import Branch, DesignedActivation, GradientDesign
from xielu.interface import Activation
from xielu.parametrize import Alpha


def _fixed(value: float) -> Alpha:
    return Alpha(value, "fixed")


class NativeActivation(DesignedActivation):
    """A fixed activation computed by a native torch kernel, described by its design."""

    def __init__(self, design: GradientDesign, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__(design, constant_buffers=False)
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


def relu() -> NativeActivation:
    """Slope 1 above zero, 0 below."""
    return NativeActivation(
        GradientDesign(
            positive=Branch(bases.zero(), _fixed(0.0), beta=1.0),
            negative=Branch(bases.zero(), _fixed(0.0), beta=0.0),
        ),
        F.relu,
    )


def _relu_squared(x: Tensor) -> Tensor:
    return torch.square(F.relu(x))


def relu2() -> NativeActivation:
    """ReLU² (So et al., 2021; paper eq. 2): slope 2x above zero, 0 below."""
    return NativeActivation(
        GradientDesign(
            positive=Branch(bases.linear(), _fixed(1.0), beta=0.0),
            negative=Branch(bases.zero(), _fixed(0.0), beta=0.0),
        ),
        _relu_squared,
    )


def gelu(approximate: str = "none") -> NativeActivation:
    """GELU, exact (erf) or with the tanh approximation."""
    base = bases.gelu_centered(approximate)
    return NativeActivation(
        GradientDesign(positive=Branch(base, _fixed(1.0), beta=0.5)),
        lambda x: F.gelu(x, approximate=approximate),
    )


def silu() -> NativeActivation:
    """SiLU: slope SiLU'(x) = 1 * (SiLU'(x) - 1/2) + 1/2 on the whole line."""
    return NativeActivation(
        GradientDesign(positive=Branch(bases.silu_centered(), _fixed(1.0), beta=0.5)), F.silu
    )


def elu(alpha: float = 1.0) -> NativeActivation:
    """ELU (paper eq. 1): slope 1 above zero, alpha e^x below."""
    return NativeActivation(
        GradientDesign(
            positive=Branch(bases.zero(), _fixed(0.0), beta=1.0),
            # alpha e^x = alpha (e^x - 1) + alpha: the shifted ELU base with beta = alpha
            negative=Branch(bases.elu(eps=0.0), _fixed(alpha), beta=alpha),
        ),
        lambda x: F.elu(x, alpha=alpha),
    )


def xsilu_design(alpha_init: float = 0.3) -> GradientDesign:
    """xSiLU (Huang, 2024; paper eq. 4): x (sigmoid(x) (1 + 2a) - a), slope limits (-a, 1 + a).

    As a design: slope (1 + 2a)(SiLU' - 1/2) + 1/2, so the branch alpha is the affine map
    1 + 2a of the trainable a. Default a = 0.3 gives the slope limit -0.3 for x -> -inf, the
    same as xIELU at its initialisation (beta - alpha_n = 0.5 - 0.8).
    """
    return GradientDesign(
        positive=Branch(
            bases.silu_centered(), Alpha(1 + 2 * alpha_init, "affine", offset=1.0, scale=2.0), 0.5
        )
    )


class XSiLU(DesignedActivation):
    """Expanded SiLU with one trainable ``alpha`` (raw value = the paper's a, shape [1])."""

    def __init__(self, alpha_init: float = 0.3) -> None:
        super().__init__(xsilu_design(float(alpha_init)))


class GatedActivation(Activation):
    """A GLU: ``act(gate) * up`` (Shazeer, 2020). Gated MLPs call it with both projections.

    Its scalars are its gate's (none for the native gates registered here).
    """

    gated = True

    def __init__(self, gate: NativeActivation) -> None:
        super().__init__()
        self.gate_activation = gate

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return self.gate_activation(gate) * up

    def effective_scalars(self) -> dict[str, float]:
        return self.gate_activation.effective_scalars()


def swiglu() -> GatedActivation:
    return GatedActivation(silu())


def geglu(approximate: str = "none") -> GatedActivation:
    return GatedActivation(gelu(approximate))


def reglu() -> GatedActivation:
    return GatedActivation(relu())
