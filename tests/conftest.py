"""Test-wide settings.

- ``XIELU_BACKEND=eager``: the fused ops' ``auto`` backend would compile a CPU kernel (~30 s on
  first use); tests that mean to exercise the compiled or Triton kernels ask for them by name.
- ``TRITON_INTERPRET=1`` on machines without CUDA, so the Triton kernels run on CPU tensors
  through Triton's interpreter. It must be set before the kernels are defined (import time).
"""

import os

import torch

os.environ.setdefault("XIELU_BACKEND", "eager")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
