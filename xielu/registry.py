"""One place that maps the name in ``activation=...`` to a constructor.

Adding an activation is one ``register(...)`` line here (and one config file for the trainer).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from xielu import ablations, baselines
from xielu.activations import XIELU, XIPReLU


@dataclass(frozen=True)
class ActivationSpec:
    """A registered activation: how to build it, and whether the MLP must be gated."""

    name: str
    factory: Callable[..., nn.Module]
    gated: bool
    summary: str


_REGISTRY: dict[str, ActivationSpec] = {}


def register(
    name: str, factory: Callable[..., nn.Module], summary: str, gated: bool = False
) -> None:
    if name in _REGISTRY:
        raise ValueError(f"activation {name!r} is registered twice")
    _REGISTRY[name] = ActivationSpec(name, factory, gated, summary)


def available_activations() -> list[str]:
    return list(_REGISTRY)


def activation_spec(name: str) -> ActivationSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"activation {name!r} is not known; choose one of: {', '.join(_REGISTRY)}"
        ) from None


def is_gated(name: str) -> bool:
    """Gated activations take (gate, up) and need a gated MLP (three projections)."""
    return activation_spec(name).gated


def get_activation(name: str, **kwargs) -> nn.Module:
    """Build the activation ``name``; ``kwargs`` go to its constructor (e.g. ``alpha_p_init``)."""
    spec = activation_spec(name)
    signature = inspect.signature(spec.factory)
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        accepted = ", ".join(p for p in signature.parameters if p != "kwargs") or "none"
        raise ValueError(
            f"activation {name!r} does not accept {sorted(kwargs)} ({error}); "
            f"its options are: {accepted}"
        ) from None
    return spec.factory(**kwargs)


# The paper's activations
register("xielu", XIELU, "xIELU (paper eq. 8), fused kernels")
register("xiprelu", XIPReLU, "xIPReLU (paper eq. 18), fused kernels")
# Baselines
register("relu", baselines.relu, "ReLU")
register("relu2", baselines.relu2, "squared ReLU (Primer)")
register("gelu", baselines.gelu, "GELU, exact erf form (approximate='tanh' for the tanh form)")
register("gelu_tanh", lambda: baselines.gelu("tanh"), "GELU, tanh approximation")
register("silu", baselines.silu, "SiLU / Swish")
register("elu", baselines.elu, "ELU")
register("xsilu", baselines.XSiLU, "expanded SiLU with trainable alpha (Huang, 2024)")
register("swiglu", baselines.swiglu, "SiLU-gated linear unit", gated=True)
register("geglu", baselines.geglu, "GELU-gated linear unit", gated=True)
register("reglu", baselines.reglu, "ReLU-gated linear unit", gated=True)
# Ablations (paper Table 4)
register("xielu_pos_cubic", ablations.xielu_positive_cubic, "xIELU, positive component x^3")
register("xielu_neg_xsilu", ablations.xielu_negative_xsilu, "xIELU, negative component xSiLU")
register("xielu_neg_silu", ablations.xielu_negative_silu, "xIELU, negative component SiLU")
register("xielu_neg_zero", ablations.xielu_negative_zero, "xIELU, negative component set to 0")
register("xielu_trainable_beta", ablations.xielu_trainable_beta, "xIELU, trainable beta_p = beta_n")
register("xiprelu_beta0", ablations.xiprelu_beta0, "xIPReLU, fixed beta_p = beta_n = 0")
register("xielu_beta1", ablations.xielu_beta1, "xIELU, fixed beta_p = beta_n = 1")
