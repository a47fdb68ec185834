"""xIELU and xIPReLU: the paper's two activations, as gradient designs with fused kernels.

Both are :class:`~xielu.design.DesignedActivation` instances (their formulas come from
integrating ``alpha * g + beta``); they only swap the generic, autograd-traced forward for the
fused custom ops of :mod:`xielu.fused`, which compute the same function and save just the input
for backward. ``fused=False`` keeps the generic path, for comparison.
"""

from __future__ import annotations

import torch
from torch import Tensor

from xielu import bases
from xielu.design import Branch, DesignedActivation, GradientDesign
from xielu.fused import ops
from xielu.interface import Activation
from xielu.parametrize import Alpha


def xielu_design(
    alpha_p_init: float = 0.8,
    alpha_n_init: float = 0.8,
    beta: float = 0.5,
    eps: float = -1e-6,
    trainable_beta: bool = False,
) -> GradientDesign:
    """Paper eq. 5: slope 2 alpha_p x + beta above 0, alpha_n (e^x - 1) + beta below.

    alpha_p = softplus(a_p) > 0 keeps the positive slope increasing; alpha_n = beta +
    softplus(a_n) > beta guarantees negative slopes below zero (section 3.3).
    """
    return GradientDesign(
        positive=Branch(bases.linear(), Alpha(alpha_p_init, "softplus"), beta),
        negative=Branch(bases.elu(eps), Alpha(alpha_n_init, "softplus", above_beta=True), beta),
        trainable_beta=trainable_beta,
    )


def xiprelu_design(
    alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5
) -> GradientDesign:
    """Paper eq. 16: slope 2 alpha x + beta on both sides, alpha_p, alpha_n = softplus(.)."""
    return GradientDesign(
        positive=Branch(bases.linear(), Alpha(alpha_p_init, "softplus"), beta),
        negative=Branch(bases.linear(), Alpha(alpha_n_init, "softplus"), beta),
    )


class _FusedPiecewise(DesignedActivation):
    """Shared machinery of XIELU and XIPReLU: fused forward, HF buffers, inference folding."""

    kind: str

    def __init__(self, design: GradientDesign, eps: float, backend: ops.Backend, fused: bool):
        super().__init__(design, constant_buffers=False)
        ops.resolve_backend(backend, _CPU)  # fail at construction on a misspelt backend
        self.backend = backend
        self.fused = fused
        self._beta = float(design.positive.beta)
        self._eps = float(eps)
        self._register_constants()

    def _fused_call(self, x: Tensor, alpha_p: Tensor, alpha_n: Tensor) -> Tensor:
        return _fused(self.kind, x, alpha_p, alpha_n, self._beta, self._eps, self.backend)

    def forward(self, x: Tensor) -> Tensor:
        if not self.fused:
            return super().forward(x)
        alphas = self.alpha_values()
        return self._fused_call(x, alphas["alpha_p"], alphas["alpha_n"])

    def fold(self) -> FoldedPiecewise:
        """An inference module with the softplus folded into constant alphas."""
        scalars = self.effective_scalars()
        return FoldedPiecewise(
            self.kind, scalars["alpha_p"], scalars["alpha_n"], self._beta, self._eps, self.backend
        ).to(self.alpha_p.device)


class XIELU(_FusedPiecewise):
    """xIELU (paper eq. 8): ``alpha_p x² + beta x`` for x > 0,
    ``alpha_n expm1(min(x, eps)) - alpha_n x + beta x`` for x <= 0.

    ``alpha_p``/``alpha_n`` parameters hold raw values (shape [1]); ``beta`` and ``eps`` are
    0-d buffers. This is the state-dict layout of Hugging Face's ``XIELUActivation``.
    """

    kind = "xielu"

    def __init__(
        self,
        alpha_p_init: float = 0.8,
        alpha_n_init: float = 0.8,
        beta: float = 0.5,
        eps: float = -1e-6,
        *,
        backend: ops.Backend = "auto",
        fused: bool = True,
    ) -> None:
        super().__init__(
            xielu_design(float(alpha_p_init), float(alpha_n_init), float(beta), float(eps)),
            eps=float(eps),
            backend=backend,
            fused=fused,
        )

    def _constants(self) -> dict[str, float]:
        return {**super()._constants(), "eps": self._eps}


class XIPReLU(_FusedPiecewise):
    """xIPReLU (paper eq. 18): ``alpha_p x² + beta x`` for x > 0, ``alpha_n x² + beta x`` below."""

    kind = "xiprelu"

    def __init__(
        self,
        alpha_p_init: float = 0.8,
        alpha_n_init: float = 0.8,
        beta: float = 0.5,
        *,
        backend: ops.Backend = "auto",
        fused: bool = True,
    ) -> None:
        super().__init__(
            xiprelu_design(float(alpha_p_init), float(alpha_n_init), float(beta)),
            eps=0.0,
            backend=backend,
            fused=fused,
        )


class FoldedPiecewise(Activation):
    """Inference-time xIELU/xIPReLU: effective alphas stored as constants, no softplus per call.

    It has no parameters; ``effective_scalars`` reports the alphas it was folded from.
    """

    def __init__(
        self, kind: str, alpha_p: float, alpha_n: float, beta: float, eps: float, backend: str
    ) -> None:
        super().__init__()
        self.kind, self.beta, self.eps, self.backend = kind, beta, eps, backend
        self.register_buffer("alpha_p", _scalar(alpha_p).reshape(1))
        self.register_buffer("alpha_n", _scalar(alpha_n).reshape(1))

    def forward(self, x: Tensor) -> Tensor:
        return _fused(self.kind, x, self.alpha_p, self.alpha_n, self.beta, self.eps, self.backend)

    def effective_scalars(self) -> dict[str, float]:
        return {"alpha_p": float(self.alpha_p), "alpha_n": float(self.alpha_n)}

    def extra_repr(self) -> str:
        return f"{self.kind}, alpha_p={float(self.alpha_p):.4g}, alpha_n={float(self.alpha_n):.4g}"


def _fused(kind: str, x: Tensor, alpha_p, alpha_n, beta: float, eps: float, backend) -> Tensor:
    if kind == "xielu":
        return ops.xielu(x, alpha_p, alpha_n, beta, eps, backend)
    return ops.xiprelu(x, alpha_p, alpha_n, beta, backend)


def _scalar(value: float) -> Tensor:
    return torch.tensor(float(value))


_CPU = torch.device("cpu")
