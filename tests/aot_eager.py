"""A test-only plugin (``training/plugins.py``): ``torch.compile`` in the ``train.py`` processes
the tests start goes through Dynamo and AOTAutograd, as on a GPU, but not through Inductor's CPU
code generation, which compiles C++ with the system compiler.

On the 2-core CI machine that C++ build was most of the end-to-end tier's time: every
compiled run of every preset (2 ranks, then the stopped run, then the resumed one) waited on
``CppCodeCache`` for its kernels. What the tier checks of compilation (that Dynamo traces the
blocks, the loss and the whole model under FSDP2, bf16 and activation checkpointing, and that a
resumed compiled run repeats the uninterrupted one bit for bit) holds with the same graphs
under ``aot_eager``; Inductor itself is exercised in this process by tests/test_parallelize.py
and tests/test_loss.py, and on the GPU by scripts/gpu_checks.sh.
"""

from __future__ import annotations

from pathlib import Path

import torch

PLUGIN = Path(__file__).resolve()

torch.compiler.set_stance("default", force_backend="aot_eager")


def components(config) -> list:
    return []
