"""Test-wide settings.

- ``XIELU_BACKEND=eager``: the fused ops' ``auto`` backend would compile a CPU kernel (~30 s on
  first use); tests that mean to exercise the compiled or Triton kernels ask for them by name.
- ``TRITON_INTERPRET=1`` on machines without CUDA, so the Triton kernels run on CPU tensors
  through Triton's interpreter. It must be set before the kernels are defined (import time).
"""

import os
import sys

import torch

os.environ.setdefault("XIELU_BACKEND", "eager")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests import helpers (tests/data_fixtures.py) and scripts as modules
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)
