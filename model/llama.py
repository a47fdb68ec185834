"""The Llama decoder the paper trains; only the MLP activation changes between runs.

Initialisation: every matrix N(0, std) with std = init_std (0.02, as Llama and OLMo), or its
width-aware version (``ModelConfig.init_scaling``), except the two projections
that write into the residual stream (attention ``o_proj`` and MLP ``down_proj``), which are
scaled by 1/sqrt(2 * n_layers) so the residual variance does not grow with depth (GPT-2,
Megatron). Norm weights start at 1; activation scalars keep their own initialisation (xIELU's
alpha_p = alpha_n = 0.8).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.document_attention import document_mask
from model.kv_cache import KVCache
from model.layers import Block, RMSNorm, model_rope_tables
from model.loss import linear_cross_entropy, token_scores


class Llama(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("model.vocab_size is unset: take it from the tokenizer first")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = model_rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # the loss's softmax through torch.compile (``model.loss``): see ``compile_blocks``
        self.compile_loss = False
        # meta tensors hold no values to initialise, and torch draws random numbers on them
        # through slow Python decompositions (0.4 s for paper_3b): whoever materialises a meta
        # model (``to_empty``) calls reset_parameters
        if not self.embed_tokens.weight.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.effective_init_std
        # µP: a hidden matrix's variance scales as fan_in_base / fan_in (its fan-in is dim, or
        # the MLP width, which grows with dim); the embedding and the head do not
        hidden_std = std / math.sqrt(self.config.width_multiplier)
        residual_std = hidden_std / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Embedding) or name == "lm_head":
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, nn.Linear):
                is_residual = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, 0.0, residual_std if is_residual else hidden_std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(
        self,
        tokens: Tensor,
        targets: Tensor | None = None,
        document_ids: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        per_token: bool = False,
        z_loss: float = 0.0,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits [batch, seq, vocab] for tokens [batch, seq]; with targets, the mean loss.

        With targets and ``per_token`` (scoring, ``eval.harness``): each target's log
        probability and whether it is the argmax, both [batch, seq] (``model.loss.token_scores``),
        also without the full logits.

        The loss path never builds the full logits (``model.loss``); targets equal to -100 are
        ignored. ``document_ids`` [batch, seq] (from the data pipeline) restricts attention to
        each packed document; RoPE is relative, so a document then sees exactly what it would
        alone.

        ``cache`` (decoding, ``model/kv_cache.py``): ``tokens`` continue the ``cache.length``
        positions the cache already holds, so they sit at RoPE positions ``cache.length`` on and
        attend over those; their keys and values are added to the cache.

        ``z_loss``: the z-loss coefficient added to the loss (``loss.z_loss``): the trainer
        passes it for its training steps; validation and evaluation leave it at 0.
        """
        seq = tokens.shape[1]
        start = 0
        if cache is not None:
            if document_ids is not None:
                raise ValueError("decoding with a cache attends over one document: no document_ids")
            start = cache.length
            cache.check_room(seq)
        if start + seq > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {start + seq} tokens exceeds model.max_seq_len="
                f"{self.config.max_seq_len}"
            )
        cos, sin = self.rope_cos[start : start + seq], self.rope_sin[start : start + seq]
        mask = None
        if document_ids is not None:
            mask = document_mask(document_ids, self.config.attention)
        x = self.embed_tokens(tokens)
        for i, layer in enumerate(self.layers):
            if cache is None:
                x = layer(x, cos, sin, mask)
            else:
                x = layer(x, cos, sin, cache=cache.layer(i))
        if cache is not None:
            cache.advance(seq)
        x = self.norm(x)
        if self.config.width_multiplier != 1:  # µP's readout: logits x base / dim
            x = x * (1.0 / self.config.width_multiplier)
        if targets is None:
            return self.lm_head(x)
        if per_token:
            return token_scores(x, self.lm_head.weight, targets, self.config.loss_chunk_tokens)
        return linear_cross_entropy(
            x,
            self.lm_head.weight,
            targets,
            chunk_size=self.config.loss_chunk_tokens,
            compiled=self.compile_loss,
            z_loss=z_loss,
        )

    def compile_blocks(self) -> None:
        """``torch.compile`` each block in place (parameter names unchanged), and the loss's
        softmax, which lies outside the blocks: left eager it would make ~8 passes over each
        chunk of logits where Inductor makes two (``model/loss.py``)."""
        for block in self.layers:
            block.compile()
        self.compile_loss = True

    @torch.no_grad()
    def activation_scalars(self) -> list[dict[str, float]]:
        """Per layer, the effective trainable scalars of its activation (alpha_p, alpha_n, ...).

        Empty dicts for activations without any (ReLU², SwiGLU).
        """
        return [layer.mlp.act_fn.effective_scalars() for layer in self.layers]

    def activation_scalar_parameters(self) -> Iterator[nn.Parameter]:
        """Every layer's activation scalars (alphas, a trainable beta), as the activation
        declares them: the optimizer keeps them out of weight decay."""
        for layer in self.layers:
            yield from layer.mlp.act_fn.scalar_parameters()
