"""Every RNG's state as tensors and plain python values, saved in each rank file.

So that the rank file loads with ``torch.load(weights_only=True)`` (``training.checkpoint.
unpickling``): numpy's own state holds an ndarray, which does not.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch


def rng_state() -> dict:
    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),  # (version, tuple of 625 ints, gauss_next): plain already
        "numpy": {
            "bit_generator": str(bit_generator),
            "key": torch.from_numpy(key.astype(np.int64)),  # uint32 words, widened losslessly
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state((n["bit_generator"], key, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Every RNG as it was before the block: for work that reseeds them (lm-eval's
    ``simple_evaluate`` seeds Python, NumPy and torch on every call), so that whether it ran
    at a step, or was interrupted there and done on resume, the run draws the same numbers."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
