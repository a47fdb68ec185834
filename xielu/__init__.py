"""xielu: activation functions designed by their gradients (Huang & Schlag, ICML 2025).

    from xielu import XIELU, get_activation
    act = XIELU()                      # alpha_p = alpha_n = 0.8, beta = 0.5, eps = -1e-6
    act = get_activation("xiprelu")    # any registered name; see available_activations()

Define your own activation by its gradient with :class:`GradientDesign` (see ``xielu.design``).
What the rest of a project may ask an activation (its Hugging Face name, its trainable scalars)
is answered by ``activation_spec(name)`` without building the module, and by the built module
itself, an :class:`Activation` (see ``xielu.interface``).
This package depends on torch only; it knows nothing of models, data or training.
"""

from xielu.activations import XIELU, FoldedPiecewise, XIPReLU, xielu_design, xiprelu_design
from xielu.baselines import GatedActivation, NativeActivation, XSiLU
from xielu.design import BaseGradient, Branch, DesignedActivation, GradientDesign
from xielu.interface import Activation, HFName
from xielu.parametrize import Alpha, inverse_softplus
from xielu.registry import (
    ActivationSpec,
    activation_spec,
    available_activations,
    from_hf_name,
    get_activation,
    is_gated,
)

__all__ = [
    "XIELU",
    "Activation",
    "ActivationSpec",
    "Alpha",
    "BaseGradient",
    "Branch",
    "DesignedActivation",
    "FoldedPiecewise",
    "GatedActivation",
    "GradientDesign",
    "HFName",
    "NativeActivation",
    "XIPReLU",
    "XSiLU",
    "activation_spec",
    "available_activations",
    "from_hf_name",
    "get_activation",
    "inverse_softplus",
    "is_gated",
    "xielu_design",
    "xiprelu_design",
]
