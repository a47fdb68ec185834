"""Keys and values of the tokens decoded so far, so each new token attends without recomputing.

Without a cache, decoding token t runs the model over all t tokens again: O(t^2) work per
sequence. With one, the prefix is run once (prefill) and each later step runs only the new
token, its queries attending over the stored keys and values of every earlier position.

Storage is preallocated to the longest sequence the caller will decode (at most the model's
``max_seq_len``), so a step writes in place instead of concatenating.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.config import ModelConfig


@dataclass
class LayerCache:
    """One layer's view of the cache: ``keys`` and ``values`` [batch, heads, capacity, head_dim],
    of which the first ``start`` positions are filled."""

    keys: Tensor
    values: Tensor
    start: int

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' keys and values; return those of every position so far."""
        end = self.start + k.shape[2]
        self.keys[:, :, self.start : end] = k
        self.values[:, :, self.start : end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """Every layer's keys and values for a batch of sequences decoded in lockstep.

    ``length`` positions are filled; ``Llama.forward(tokens, cache=cache)`` runs the next
    ``tokens.shape[1]`` positions, at RoPE positions ``length, length + 1, ...``, and advances it.
    """

    def __init__(
        self,
        config: ModelConfig,
        batch: int,
        capacity: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        capacity = config.max_seq_len if capacity is None else capacity
        if not 0 < capacity <= config.max_seq_len:
            raise ValueError(
                f"a cache of {capacity} positions does not fit the model's context of "
                f"{config.max_seq_len} (model.max_seq_len)"
            )
        shape = (config.n_layers, batch, config.kv_heads, capacity, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, capacity: int | None = None) -> KVCache:
        """A cache in ``model``'s dtype and device."""
        weight = model.embed_tokens.weight
        return cls(model.config, batch, capacity, weight.dtype, weight.device)

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self.keys[index], self.values[index], self.length)

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions as filled (after every layer has appended them)."""
        self.length += n

    def check_room(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise ValueError(
                f"the cache holds {self.length} of {self.capacity} positions; {n} more do not fit"
            )
