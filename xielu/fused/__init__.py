"""Fused kernels for xIELU and xIPReLU: custom ops over Triton, compiled-CPU and eager kernels."""

from xielu.fused.ops import BACKENDS, resolve_backend, xielu, xiprelu

__all__ = ["BACKENDS", "resolve_backend", "xielu", "xiprelu"]
