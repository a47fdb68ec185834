"""The paper's method as an API: design an activation by its gradient, get it by integration.

Section 2.3 of the paper: pick a base gradient g, make it trainable as ``alpha * g(x) + beta`` and
integrate. Per branch (x > 0 and x <= 0) the user supplies g and its antiderivative G; the library
builds

    f(x) = alpha * (G(x) - G(0)) + beta * x

so that f(0) = 0 on both branches and the two pieces join continuously at the origin (the
paper's choice C = -alpha * G(0), e.g. C_n = -alpha_n for xIELU). xIELU, xIPReLU, xSiLU and every
ablation of the paper are instances of this; see ``xielu.activations``, ``xielu.baselines`` and
``xielu.ablations``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from xielu.interface import Activation
from xielu.parametrize import Alpha

TensorFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class BaseGradient:
    """A base gradient ``g`` and an antiderivative ``G`` (any constant; G(0) is subtracted).

    ``G`` is what the forward pass evaluates, so write it in its numerically stable form (expm1
    rather than exp - 1); autograd differentiates it, and the library's tests check that the
    result equals ``g``. ``G0`` declares G(0) when ``G`` deliberately deviates from the exact
    antiderivative near 0 (xIELU's expm1 capped at eps: the paper keeps C_n = -alpha_n); by
    default it is evaluated.
    """

    name: str
    g: TensorFn
    G: TensorFn
    G0: float | None = None

    def value_at_zero(self) -> float:
        if self.G0 is not None:
            return self.G0
        # explicit device: modules may be built under a meta default device (sizing big models)
        return float(self.G(torch.zeros((), dtype=torch.float64, device="cpu")))


@dataclass(frozen=True)
class Branch:
    """One side of the origin: gradient ``alpha * base.g(x) + beta``."""

    base: BaseGradient
    alpha: Alpha
    beta: float = 0.5


@dataclass(frozen=True)
class GradientDesign:
    """A whole activation: ``positive`` on x > 0 and ``negative`` on x <= 0.

    With ``negative=None`` the positive branch covers the whole real line (xSiLU, SiLU, GELU).
    ``trainable_beta`` turns the shared gradient intercept beta_p = beta_n into one parameter
    (the paper's "trainable beta" ablation); both branches must then start from the same beta.
    """

    positive: Branch
    negative: Branch | None = None
    trainable_beta: bool = False

    def __post_init__(self) -> None:
        negative_beta = self.positive.beta if self.negative is None else self.negative.beta
        if self.trainable_beta and self.positive.beta != negative_beta:
            raise ValueError("a trainable beta is shared, so beta_p and beta_n must be equal")

    @property
    def piecewise(self) -> bool:
        return self.negative is not None

    def branches(self) -> dict[str, Branch]:
        """Branches keyed by the suffix of their parameter names (alpha_p, alpha_n / alpha)."""
        if self.negative is None:
            return {"": self.positive}
        return {"_p": self.positive, "_n": self.negative}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in fp32: x**2 and expm1 lose too much in bf16."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class DesignedActivation(Activation):
    """An ``nn.Module`` built from a :class:`GradientDesign`.

    Parameters hold raw (pre-constraint) values of shape ``[1]`` (FSDP rejects 0-d parameters),
    named ``alpha_p``/``alpha_n`` (``alpha`` for a whole-line design); a fixed beta is a 0-d
    buffer ``beta`` (``beta_p``/``beta_n`` when the branches differ), a trainable one a ``[1]``
    parameter. This is the state-dict layout of Hugging Face's ``XIELUActivation``.
    """

    def __init__(self, design: GradientDesign, *, constant_buffers: bool = True) -> None:
        super().__init__()
        self.design = design
        self._branches = design.branches()
        if design.trainable_beta:
            self.beta = nn.Parameter(torch.tensor([design.positive.beta]))
        elif constant_buffers:
            self._register_constants()
        self._integration_offsets = {}
        for suffix, branch in self._branches.items():
            self._integration_offsets[suffix] = branch.base.value_at_zero()
            if branch.alpha.trainable:
                raw = branch.alpha.raw_init(branch.beta)
                self.register_parameter(f"alpha{suffix}", nn.Parameter(torch.tensor([raw])))

    def _register_constants(self) -> None:
        for name, value in self._constants().items():
            self.register_buffer(name, torch.tensor(value))
        self.register_load_state_dict_post_hook(_refuse_changed_constants)

    # -- scalars ---------------------------------------------------------------------------
    def _constants(self) -> dict[str, float]:
        """Fixed scalars stored as buffers (documentation in the state dict, never trained)."""
        if self.design.trainable_beta:
            return {}
        betas = {suffix: branch.beta for suffix, branch in self._branches.items()}
        if len(set(betas.values())) == 1:
            return {"beta": next(iter(betas.values()))}
        return {f"beta{suffix}": value for suffix, value in betas.items()}

    def _beta_of(self, suffix: str) -> Tensor | float:
        if self.design.trainable_beta:
            return self.beta
        return self._branches[suffix].beta

    def alpha_values(self) -> dict[str, Tensor | float]:
        """Effective alphas, differentiable in the raw parameters: {"alpha_p": ..., ...}."""
        out = {}
        for suffix, branch in self._branches.items():
            raw = getattr(self, f"alpha{suffix}", None)
            out[f"alpha{suffix}"] = branch.alpha.effective(raw, self._beta_of(suffix))
        return out

    @torch.no_grad()
    def effective_scalars(self) -> dict[str, float]:
        """Effective values of the *trainable* scalars (alphas, a trainable beta) as floats, for
        logging and plots; fixed alphas (SiLU's, ReLU²'s) are left out."""
        trainable = {f"alpha{s}" for s, b in self._branches.items() if b.alpha.trainable}
        out = {k: float(v) for k, v in self.alpha_values().items() if k in trainable}
        if self.design.trainable_beta:
            out["beta"] = float(self.beta)
        return out

    # -- math ------------------------------------------------------------------------------
    def _branch(self, suffix: str, x: Tensor, alpha: Tensor | float) -> Tensor:
        branch = self._branches[suffix]
        # Each branch sees only its own half-line, so an antiderivative that overflows on the
        # other side (x**3, exp) never puts inf into the value torch.where throws away, and its
        # gradient there is exactly zero rather than 0 * inf = nan. clamp's gradient is 1 at
        # the boundary itself, so x = 0 keeps the negative branch's full derivative.
        if suffix == "_p":
            x_branch = x.clamp(min=0)
        elif suffix == "_n":
            x_branch = x.clamp(max=0)
        else:
            x_branch = x
        integral = branch.base.G(x_branch)
        offset = self._integration_offsets[suffix]
        if offset != 0.0:
            integral = integral - offset
        return alpha * integral + self._beta_of(suffix) * x

    def forward(self, x: Tensor) -> Tensor:
        xc = x.to(compute_dtype(x.dtype))
        alphas = self.alpha_values()
        if not self.design.piecewise:
            y = self._branch("", xc, alphas["alpha"])
        else:
            y = torch.where(
                xc > 0,
                self._branch("_p", xc, alphas["alpha_p"]),
                self._branch("_n", xc, alphas["alpha_n"]),
            )
        return y.to(x.dtype)

    @torch.no_grad()
    def designed_gradient(self, x: Tensor) -> Tensor:
        """``alpha * g(x) + beta`` on each branch: the gradient the design asked for."""
        alphas = self.alpha_values()

        def on(suffix: str, xs: Tensor) -> Tensor:
            branch = self._branches[suffix]
            return alphas[f"alpha{suffix}"] * branch.base.g(xs) + self._beta_of(suffix)

        if not self.design.piecewise:
            return on("", x)
        return torch.where(x > 0, on("_p", x.clamp(min=0)), on("_n", x.clamp(max=0)))

    def extra_repr(self) -> str:
        """Each branch's designed gradient (``g`` by its base's name), then the trainable
        scalars' values: ``print(model)`` says which activation the gradients integrate to."""
        where = {"_p": "x > 0: ", "_n": "x <= 0: ", "": ""}
        terms = []
        for suffix, branch in self._branches.items():
            alpha = f"alpha{suffix}" if branch.alpha.trainable else f"{branch.alpha.init:g}"
            beta = "beta" if self.design.trainable_beta else f"{branch.beta:g}"
            terms.append(f"{where[suffix]}{alpha}*[{branch.base.name}] + {beta}")
        scalars = [f"{k}={v:.4g}" for k, v in self.effective_scalars().items()]
        return ", ".join([*terms, *scalars])


def _refuse_changed_constants(module: DesignedActivation, incompatible_keys) -> None:
    """The formulas use the constructor's constants; a checkpoint with others must not load
    silently into a module that would ignore them. Equal up to bf16 rounding counts as equal:
    Hugging Face stores these buffers in bf16."""
    for name, expected in module._constants().items():
        buffer = getattr(module, name, None)
        if buffer is None:
            continue
        loaded = float(buffer)
        if not math.isclose(loaded, expected, rel_tol=2**-7):
            raise ValueError(
                f"{type(module).__name__}: the checkpoint has {name}={loaded:g} but this module "
                f"was built with {name}={expected:g}; construct it with {name}={loaded:g}"
            )
