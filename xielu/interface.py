"""What every activation tells the rest of the project, in two halves.

Facts fixed by the name and options (``xielu.registry.ActivationSpec``): whether the MLP is
gated, the names of its trainable scalars, and its name in Hugging Face transformers
(:class:`HFName`). Export, import and parameter counts read these without building a module.

Facts about a built module (:class:`Activation`, the base of every module that
``get_activation`` returns): its scalars' current effective values, for logging, and which of
its parameters are activation scalars, for the optimizer's no-decay group.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from torch import nn


@dataclass(frozen=True)
class HFName:
    """The activation as transformers' ``hidden_act`` (a key of its ``ACT2FN``).

    Attributes:
        hidden_act: the ``ACT2FN`` name; for a GLU, the name of its gate.
        options: the activation's options, defaults included, that this name stands for
            (GELU's ``approximate='tanh'`` is ``gelu_pytorch_tanh``); with other options the
            activation is not exportable under this name.
        any_options: every option value is exportable under this name, because the options
            that matter travel in the state dict (xIELU's inits, beta and eps).
        state_options: options kept as buffers in the activation's state dict, which an import
            without the project's own config reads back (xIELU's ``beta`` and ``eps``).
    """

    hidden_act: str
    options: Mapping[str, object] = field(default_factory=dict)
    any_options: bool = False
    state_options: tuple[str, ...] = ()

    def stands_for(self, options: Mapping[str, object]) -> bool:
        """Whether an activation built with ``options`` (defaults included) is this name."""
        return self.any_options or dict(options) == dict(self.options)


class Activation(nn.Module):
    """The base of every activation module: its gating, and its trainable scalars.

    A plain activation is called as ``act(x)``; a gated one (``gated = True``) as
    ``act(gate, up)`` and needs a gated MLP.
    """

    gated: ClassVar[bool] = False

    def effective_scalars(self) -> dict[str, float]:
        """Effective values of the trainable scalars (alpha_p, alpha_n, ...) as floats, keyed by
        their parameter names, for logging; empty for an activation without any."""
        return {}

    def scalar_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters that are activation scalars (no weight decay by default). Every
        parameter of an activation is one: its alphas and a trainable beta."""
        return self.parameters()
