"""xIELU and xIPReLU as fused custom ops with a one-pass backward.

``torch.library.custom_op`` makes each activation a single opaque node (``xielu::xielu``,
``xielu::xiprelu``) with a fake implementation, so ``torch.compile`` traces through it without a
graph break, and a registered autograd formula that saves only the input (plus two 1-element
alphas) for backward. Autograd of the plain formula keeps ~7 input-sized intermediates alive; this
keeps one.

Three interchangeable kernel sets compute the same math (``xielu.fused.formulas``):

- ``triton``: Triton kernels, the default for CUDA tensors;
- ``compiled``: the torch formulas compiled by Inductor into one vectorised C++ loop each way,
  the default on CPU when a C++ compiler is present;
- ``eager``: the same formulas run op by op; always available, used as the fallback.

``backend="auto"`` picks per tensor; the ``XIELU_BACKEND`` environment variable overrides it.

A fourth path is no kernel set inside the op but the op's opposite: ``traced`` computes the same
formulas in an ``autograd.Function`` (:class:`TracedPiecewise`) that ``torch.compile`` traces
into the model's graph, so that Inductor fuses the activation with its neighbours: under FP8 the
down projection's amax and float8 cast read the activation's input, not its output, as they
read ReLU²'s (``tests/test_activation_fusion.py`` reads the generated code). It saves what the
op saves (the input and the two alphas); its backward is the op's one-pass formula. Which of the
two is faster is a measurement per GPU, precision and FP8 recipe (:func:`traced_is_faster`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from xielu.fused import formulas

Backend = Literal["auto", "triton", "compiled", "eager", "traced"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "compiled", "eager", "traced")

# Where the traced path was measured faster than the custom op, by (device type, precision,
# float8 recipe), in a compiled paper_1b step (``scripts/gpu_checks.sh first``'s
# ``activation_paths``, docs/performance.md). Empty: not measured on a GPU yet, so ``auto``
# keeps the op everywhere.
TRACED_FASTER: frozenset[tuple[str, str, str]] = frozenset()


def traced_is_faster(device_type: str, precision: str, float8: str) -> bool:
    """Whether a compiled run on this device, precision and FP8 recipe should take the traced
    path when the activation's backend is ``auto`` (``TRACED_FASTER``)."""
    return (device_type, precision, float8) in TRACED_FASTER


def _probe_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def _probe_cpp_compiler() -> bool:
    """Inductor's CPU code generation needs a C++ compiler at run time."""
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    return any(c and shutil.which(c) for c in candidates)


# Probed once at import: resolve_backend runs inside torch.compile traces, where file-system
# look-ups cannot be traced.
TRITON_AVAILABLE = _probe_triton()
CPP_COMPILER_AVAILABLE = _probe_cpp_compiler()


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The concrete kernel set for a tensor on ``device`` of ``dtype``; validates the name.

    The Triton kernels compute in fp32, so float64 goes to the torch formulas, which keep it
    (``gradcheck`` needs it), and asking for Triton with float64 is an error rather than a
    silent fp32 result.
    """
    from_environment = backend == "auto" and "XIELU_BACKEND" in os.environ
    requested = os.environ["XIELU_BACKEND"] if from_environment else backend
    if requested not in BACKENDS:
        where = "XIELU_BACKEND={!r}, the environment variable," if from_environment else "{!r}"
        raise ValueError(
            f"xielu backend {where.format(requested)} is not known; choose one of: {BACKENDS}"
        )
    if requested == "triton" and dtype == torch.float64:
        raise ValueError(
            "xielu backend 'triton' computes in fp32; float64 input needs backend='eager' or "
            "'auto' (which picks a float64 kernel)"
        )
    if requested != "auto":
        if requested == "triton" and not TRITON_AVAILABLE:
            raise RuntimeError("backend 'triton' was requested but triton is not installed")
        return requested
    if device.type == "cuda" and TRITON_AVAILABLE:
        # float64 is the checking path (gradcheck), not a fast one: the formulas op by op
        return "eager" if dtype == torch.float64 else "triton"
    if device.type == "cpu" and CPP_COMPILER_AVAILABLE and not _compile_failed:
        return "compiled"
    return "eager"


_compile_failed = False
# Formulas whose compiled variants (one per kind, dtype, eps, calling context) reached dynamo's
# recompile limit; new variants of those run eager, the compiled ones keep their kernels.
_over_recompile_limit: set[Callable] = set()


def _recompile_limit_hit() -> type[BaseException] | tuple:
    """Dynamo's exception for a recompile limit reached; looked up when an exception is being
    matched, so that importing xielu does not import Dynamo (2 s) in a process that never
    compiles (evaluation, export, the tests' eager runs)."""
    return getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", ())


@functools.cache
def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=True, fullgraph=True)


def _run(backend: str, eager_fn: Callable, triton_name: str, *args):
    global _compile_failed
    if backend == "triton":
        from xielu.fused import triton_kernels

        return getattr(triton_kernels, triton_name)(*args)
    if backend == "compiled" and not _compile_failed:
        # Inside the op autograd records nothing; detached inputs keep requires_grad (training
        # vs validation) from making a compiled variant each.
        detached = [a.detach() if isinstance(a, Tensor) else a for a in args]
        try:
            return _compiled(eager_fn)(*detached)
        except _recompile_limit_hit():
            # not a broken toolchain: compilation stays on for every other call
            if eager_fn not in _over_recompile_limit:
                _over_recompile_limit.add(eager_fn)
                warnings.warn(
                    f"xielu: {eager_fn.__name__} has more compiled variants than "
                    f"torch._dynamo.config.recompile_limit ({torch._dynamo.config.recompile_limit})"
                    "; new dtype/eps variants run the eager kernel. Raise the limit to compile "
                    "them.",
                    stacklevel=3,
                )
            return eager_fn(*args)
        except Exception as error:  # a broken toolchain must not stop training
            _compile_failed = True
            warnings.warn(
                f"xielu: compiling the CPU kernel failed ({type(error).__name__}: {error}); "
                "falling back to the eager kernel. Set XIELU_BACKEND=eager to silence this.",
                stacklevel=3,
            )
    return eager_fn(*args)


def _define(kind: str) -> Callable[..., Tensor]:
    """Register ``xielu::<kind>`` and its backward op, with fake kernels and autograd."""

    @torch.library.custom_op(f"xielu::{kind}", mutates_args=())
    def forward_op(
        x: Tensor, alpha_p: Tensor, alpha_n: Tensor, beta: float, eps: float, backend: str
    ) -> Tensor:
        return _run(
            backend,
            formulas.piecewise_forward,
            "forward",
            x,
            alpha_p,
            alpha_n,
            beta,
            eps,
            kind,
        )

    @forward_op.register_fake
    def _(x, alpha_p, alpha_n, beta, eps, backend):
        return torch.empty_like(x)

    @torch.library.custom_op(f"xielu::{kind}_backward", mutates_args=())
    def backward_op(
        grad: Tensor,
        x: Tensor,
        alpha_p: Tensor,
        alpha_n: Tensor,
        beta: float,
        eps: float,
        backend: str,
    ) -> tuple[Tensor, Tensor, Tensor]:
        return _run(
            backend,
            formulas.piecewise_backward,
            "backward",
            grad,
            x,
            alpha_p,
            alpha_n,
            beta,
            eps,
            kind,
        )

    @backward_op.register_fake
    def _(grad, x, alpha_p, alpha_n, beta, eps, backend):
        return torch.empty_like(x), torch.empty_like(alpha_p), torch.empty_like(alpha_n)

    def setup_context(ctx, inputs, output) -> None:
        x, alpha_p, alpha_n, beta, eps, backend = inputs
        ctx.save_for_backward(x, alpha_p, alpha_n)
        ctx.constants = (beta, eps, backend)

    def backward(ctx, grad: Tensor):
        x, alpha_p, alpha_n = ctx.saved_tensors
        dx, d_alpha_p, d_alpha_n = backward_op(grad, x, alpha_p, alpha_n, *ctx.constants)
        return dx, d_alpha_p, d_alpha_n, None, None, None

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


_xielu_op = _define("xielu")
_xiprelu_op = _define("xiprelu")


class TracedPiecewise(torch.autograd.Function):
    """The ``traced`` path: the formulas of :mod:`xielu.fused.formulas` as an autograd function
    ``torch.compile`` traces (forward and backward) into the surrounding graph, saving what the
    custom op saves. Run eagerly, it is the ``eager`` kernel set op by op."""

    @staticmethod
    def forward(x: Tensor, alpha_p: Tensor, alpha_n: Tensor, beta: float, eps: float, kind: str):
        return formulas.piecewise_forward(x, alpha_p, alpha_n, beta, eps, kind)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, alpha_p, alpha_n, beta, eps, kind = inputs
        ctx.save_for_backward(x, alpha_p, alpha_n)
        ctx.constants = (beta, eps, kind)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, alpha_p, alpha_n = ctx.saved_tensors
        dx, d_alpha_p, d_alpha_n = formulas.piecewise_backward(
            grad, x, alpha_p, alpha_n, *ctx.constants
        )
        return dx, d_alpha_p, d_alpha_n, None, None, None


def _apply(kind: str, x: Tensor, alpha_p, alpha_n, beta: float, eps: float, backend: str):
    chosen = resolve_backend(backend, x.device, x.dtype)
    alpha_p, alpha_n = _as_alpha(alpha_p, x), _as_alpha(alpha_n, x)
    if chosen == "traced":
        return TracedPiecewise.apply(x, alpha_p, alpha_n, float(beta), float(eps), kind)
    op = _xielu_op if kind == "xielu" else _xiprelu_op
    return op(x, alpha_p, alpha_n, float(beta), float(eps), chosen)


def _as_alpha(value: Tensor | float, like: Tensor) -> Tensor:
    if isinstance(value, Tensor):
        return value.reshape(1)
    return torch.tensor([float(value)], device=like.device, dtype=torch.float32)


def xielu(
    x: Tensor,
    alpha_p: Tensor | float,
    alpha_n: Tensor | float,
    beta: float = 0.5,
    eps: float = -1e-6,
    backend: Backend = "auto",
) -> Tensor:
    """Fused xIELU (paper eq. 8) with *effective* alphas (alpha_n already includes beta)."""
    return _apply("xielu", x, alpha_p, alpha_n, beta, eps, backend)


def xiprelu(
    x: Tensor,
    alpha_p: Tensor | float,
    alpha_n: Tensor | float,
    beta: float = 0.5,
    backend: Backend = "auto",
) -> Tensor:
    """Fused xIPReLU (paper eq. 18) with *effective* alphas."""
    return _apply("xiprelu", x, alpha_p, alpha_n, beta, 0.0, backend)
