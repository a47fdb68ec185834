"""Parameter counts and training FLOPs per token, as pure functions of a config (for MFU)."""

from __future__ import annotations

from dataclasses import dataclass

from model.config import ModelConfig
from xielu import activation_spec


@dataclass(frozen=True)
class ParameterCount:
    embedding: int
    lm_head: int  # 0 when tied to the embedding
    attention: int
    mlp: int
    norms: int
    activation_scalars: int

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.mlp
            + self.norms
            + self.activation_scalars
        )

    @property
    def matmul(self) -> int:
        """Parameters used in matrix multiplies per token: all but the embedding lookup."""
        return self.lm_head_matmul + self.attention + self.mlp

    @property
    def lm_head_matmul(self) -> int:
        # a tied head still multiplies by the (shared) embedding matrix
        return self.lm_head or self.embedding


def count_parameters(config: ModelConfig) -> ParameterCount:
    d, h, L, V = config.dim, config.hidden, config.n_layers, config.vocab_size
    if V is None:
        raise ValueError("model.vocab_size is unset: take it from the tokenizer first")
    mlp_matrices = 3 if config.gated else 2
    qk_norm = 2 * config.head_dim if config.qk_norm else 0
    # each trainable scalar of the activation is one number (shape [1]), per layer
    scalars = len(activation_spec(config.activation).scalars)
    return ParameterCount(
        embedding=V * d,
        lm_head=0 if config.tie_embeddings else V * d,
        attention=L * (2 * d * d + 2 * d * config.kv_dim),  # q and o; k and v
        mlp=L * mlp_matrices * d * h,
        norms=L * (2 * d + qk_norm) + d,
        activation_scalars=L * scalars,
    )


def training_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """6 * matmul parameters + 12 * n_layers * dim * seq_len (PaLM, appendix B).

    The first term is forward (2 FLOPs per multiply-add) plus backward (twice the forward); the
    second is attention's QK^T and AV, counted over the full sequence without a causal discount.
    Pointwise work (norms, activations) is left out, as is conventional for MFU.
    """
    params = count_parameters(config)
    return 6.0 * params.matmul + 12.0 * config.n_layers * config.dim * seq_len
