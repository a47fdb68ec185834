"""One place that maps the name in ``activation=...`` to a constructor, and to its facts.

Adding an activation is one ``register(...)`` line here; the trainer offers every registered
name as ``activation=<name>`` with no config file (``training.config.register_configs``; the
recipe: docs/extending.md).
The line also states the facts other parts of the project need without building the module:
the names of its trainable scalars (parameter counts) and its Hugging Face name (export and
import); see ``xielu.interface``. The tests check both against the built module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from xielu import ablations, baselines
from xielu.activations import XIELU, XIPReLU
from xielu.interface import Activation, HFName


@dataclass(frozen=True)
class ActivationSpec:
    """A registered activation: how to build it, and what is known of it without building it.

    Attributes:
        name: the name in ``activation=...``.
        factory: builds the module; its keyword arguments are the activation's options.
        gated: called as ``act(gate, up)`` and needs a gated MLP (three projections).
        summary: one line for listings.
        scalars: names of its trainable scalar parameters (each of shape [1]), in parameter
            order; for a GLU, its gate's. Their count is the activation's parameter count.
        hf: its names in transformers' ``ACT2FN``, each for the options it stands for; empty
            when transformers has no equivalent.
    """

    name: str
    factory: Callable[..., Activation]
    gated: bool
    summary: str
    scalars: tuple[str, ...] = ()
    hf: tuple[HFName, ...] = ()

    def options(self, **kwargs) -> dict[str, object]:
        """The constructor options ``kwargs`` amount to, defaults filled in.

        Unknown options raise, naming the accepted ones.
        """
        signature = inspect.signature(self.factory)
        try:
            bound = signature.bind(**kwargs)
        except TypeError as error:
            accepted = ", ".join(p for p in signature.parameters if p != "kwargs") or "none"
            raise ValueError(
                f"activation {self.name!r} does not accept {sorted(kwargs)} ({error}); "
                f"its options are: {accepted}"
            ) from None
        bound.apply_defaults()
        options = {}
        for key, value in bound.arguments.items():
            if signature.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
                options.update(value)  # options a factory passes on (xielu_beta1's backend)
            else:
                options[key] = value
        return options

    def hf_name(self, **kwargs) -> str | None:
        """transformers' ``hidden_act`` for this activation built with ``kwargs`` (a GLU's:
        its gate's), or None when transformers has no equivalent."""
        options = self.options(**kwargs)
        return next((hf.hidden_act for hf in self.hf if hf.stands_for(options)), None)


_REGISTRY: dict[str, ActivationSpec] = {}


def register(
    name: str,
    factory: Callable[..., Activation],
    summary: str,
    gated: bool = False,
    scalars: tuple[str, ...] = (),
    hf: HFName | tuple[HFName, ...] = (),
) -> None:
    if name in _REGISTRY:
        raise ValueError(f"activation {name!r} is registered twice")
    hf = (hf,) if isinstance(hf, HFName) else tuple(hf)
    _REGISTRY[name] = ActivationSpec(name, factory, gated, summary, tuple(scalars), hf)


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


def get_activation(name: str, **kwargs) -> Activation:
    """Build the activation ``name``; ``kwargs`` go to its constructor (e.g. ``alpha_p_init``)."""
    spec = activation_spec(name)
    spec.options(**kwargs)  # an unknown option fails here, naming the accepted ones
    return spec.factory(**kwargs)


def check_options(name: str, options: dict) -> None:
    """Build ``name`` with ``options`` once, on the CPU, and throw it away: an option it does
    not take, a value it cannot hold (a string for a float, an alpha of 0 under softplus) or a
    backend nobody knows is then refused where settings are checked, with the activation's own
    message (a ValueError), rather than when the model is built."""
    try:
        get_activation(name, **options)
    except (TypeError, ValueError) as error:
        raise ValueError(str(error)) from None
    except RuntimeError:
        pass  # this machine lacks what an option asks for (Triton): the device's to say


def from_hf_name(hidden_act: str, gated: bool) -> tuple[str, dict[str, object]] | None:
    """The registered activation (name, options) that transformers' ``hidden_act`` stands for,
    in a gated MLP or a plain one; None if there is none.

    Options equal to their defaults are left out. When several activations fit, the one that
    needs the fewest options wins, then the first registered: ``gelu_pytorch_tanh`` in a plain
    MLP is ``gelu_tanh`` rather than ``gelu`` with ``approximate='tanh'``.
    """
    candidates = []
    for spec in _REGISTRY.values():
        if spec.gated != gated:
            continue
        defaults = spec.options()
        for hf in spec.hf:
            if hf.hidden_act == hidden_act:
                options = {} if hf.any_options else dict(hf.options)
                options = {
                    k: v for k, v in options.items() if k not in defaults or defaults[k] != v
                }
                candidates.append((spec.name, options))
    return min(candidates, key=lambda found: len(found[1]), default=None)


# transformers' ACT2FN names. GELU's depends on its approximation; xIELU is "xielu" whatever its
# options, since its alphas, beta and eps travel in the state dict (mlp.act_fn.*).
_GELU_HF = (
    HFName("gelu", {"approximate": "none"}),
    HFName("gelu_pytorch_tanh", {"approximate": "tanh"}),
)
_XIELU_HF = HFName("xielu", any_options=True, state_options=("beta", "eps"))
_ALPHAS = ("alpha_p", "alpha_n")

# The paper's activations
register("xielu", XIELU, "xIELU (paper eq. 8), fused kernels", scalars=_ALPHAS, hf=_XIELU_HF)
register("xiprelu", XIPReLU, "xIPReLU (paper eq. 18), fused kernels", scalars=_ALPHAS)
# Baselines
register("relu", baselines.relu, "ReLU", hf=HFName("relu"))
register("relu2", baselines.relu2, "squared ReLU (Primer)", hf=HFName("relu2"))
register(
    "gelu",
    baselines.gelu,
    "GELU, exact erf form (approximate='tanh' for the tanh form)",
    hf=_GELU_HF,
)
register(
    "gelu_tanh",
    lambda: baselines.gelu("tanh"),
    "GELU, tanh approximation",
    hf=HFName("gelu_pytorch_tanh"),
)
register("silu", baselines.silu, "SiLU / Swish", hf=HFName("silu"))
register("elu", baselines.elu, "ELU")
register(
    "xsilu", baselines.XSiLU, "expanded SiLU with trainable alpha (Huang, 2024)", scalars=("alpha",)
)
register("swiglu", baselines.swiglu, "SiLU-gated linear unit", gated=True, hf=HFName("silu"))
register("geglu", baselines.geglu, "GELU-gated linear unit", gated=True, hf=_GELU_HF)
register("reglu", baselines.reglu, "ReLU-gated linear unit", gated=True, hf=HFName("relu"))
# Ablations (paper Table 4)
register(
    "xielu_pos_cubic",
    ablations.xielu_positive_cubic,
    "xIELU, positive component x^3",
    scalars=_ALPHAS,
)
register(
    "xielu_neg_xsilu",
    ablations.xielu_negative_xsilu,
    "xIELU, negative component xSiLU",
    scalars=_ALPHAS,
)
register(
    "xielu_neg_silu",
    ablations.xielu_negative_silu,
    "xIELU, negative component SiLU",
    scalars=("alpha_p",),
)
register(
    "xielu_neg_zero",
    ablations.xielu_negative_zero,
    "xIELU, negative component set to 0",
    scalars=("alpha_p",),
)
register(
    "xielu_trainable_beta",
    ablations.xielu_trainable_beta,
    "xIELU, trainable beta_p = beta_n",
    scalars=("beta", *_ALPHAS),
)
register(
    "xiprelu_beta0", ablations.xiprelu_beta0, "xIPReLU, fixed beta_p = beta_n = 0", scalars=_ALPHAS
)
register("xielu_beta1", ablations.xielu_beta1, "xIELU, fixed beta_p = beta_n = 1", scalars=_ALPHAS)
