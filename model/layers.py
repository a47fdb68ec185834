"""Building blocks of the decoder: RMSNorm, rotary embeddings, attention, and the MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.document_attention import flex
from model.kv_cache import LayerCache
from xielu import get_activation


class RMSNorm(nn.Module):
    """x / rms(x) * weight, with the statistics in fp32 whatever the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rope_tables(
    head_dim: int,
    max_seq_len: int,
    theta: float,
    linear_factor: float = 1.0,
    inv_freq: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """cos and sin of shape [max_seq_len, head_dim], in the half-split layout.

    Frequencies theta^(-2i/d) for i < d/2 (or ``inv_freq``, e.g. :func:`llama3_frequencies`),
    repeated for both halves, as Hugging Face's Llama lays them out, so that exported q/k
    weights need no permutation. ``linear_factor``: position interpolation, every position
    divided by it (transformers' ``linear`` type).
    """
    if inv_freq is None:
        inv_freq = rope_frequencies(head_dim, theta)
    positions = torch.arange(max_seq_len, dtype=torch.float64) / linear_factor
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rope_frequencies(head_dim: int, theta: float) -> Tensor:
    """Plain RoPE's theta^(-2i/d), i < d/2, in float64."""
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def llama3_frequencies(
    inv_freq: Tensor, factor: float, low_freq_factor: float, high_freq_factor: float, context: int
) -> Tensor:
    """Llama 3.1's RoPE scaling of the frequencies (transformers' ``llama3`` type).

    A frequency whose wavelength 2 pi / f is longer than ``context / low_freq_factor`` (it
    never turned once in the original context) is divided by ``factor``; one shorter than
    ``context / high_freq_factor`` is kept; between them the two are blended by
    ``s = (context / wavelength - low) / (high - low)``: ``(1 - s) f / factor + s f``.
    """
    wavelength = 2 * torch.pi / inv_freq
    blend = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - blend) * inv_freq / factor + blend * inv_freq
    long = wavelength > context / low_freq_factor
    short = wavelength < context / high_freq_factor
    return torch.where(long, inv_freq / factor, torch.where(short, inv_freq, blended))


def model_rope_tables(config: ModelConfig) -> tuple[Tensor, Tensor]:
    """The model's cos and sin tables, scaled as ``config.rope_scaling`` says."""
    if config.rope_scaling == "llama3":
        inv_freq = llama3_frequencies(
            rope_frequencies(config.head_dim, config.rope_theta),
            config.rope_scaling_factor,
            config.rope_low_freq_factor,
            config.rope_high_freq_factor,
            config.rope_original_max_seq_len,
        )
        return rope_tables(config.head_dim, config.max_seq_len, config.rope_theta, 1.0, inv_freq)
    return rope_tables(
        config.head_dim, config.max_seq_len, config.rope_theta, config.rope_scaling_factor
    )


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i + d/2}) by the position's angle; x is [batch, heads, seq, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention through ``scaled_dot_product_attention``: multi-head, or grouped-
    query with ``config.n_kv_heads`` key/value heads, each serving a group of query heads (the
    kernels take the groups as they are: ``enable_gqa``, no copies of the keys)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.n_kv_heads = config.kv_heads
        self.q_proj = nn.Linear(config.dim, config.dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.kv_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.kv_dim, bias=False)
        self.o_proj = nn.Linear(config.dim, config.dim, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | BlockMask | None = None,  # noqa: F821 (a type FlexAttention defines)
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``mask``: attention within packed documents (``model/document_attention.py``): a
        FlexAttention block mask, or a boolean [batch, 1, seq, seq], True where attending is
        allowed; plain causal attention without it.

        ``cache``: this layer's keys and values of the ``cache.start`` positions before ``x``
        (``model/kv_cache.py``); ``cos``/``sin`` must then be the tables at ``x``'s own positions
        (``start ... start + seq - 1``). The new keys and values are appended, and each new
        query attends causally over the cached and the new ones."""
        batch, seq, dim = x.shape

        def heads(t: Tensor, n: int) -> Tensor:
            return t.view(batch, seq, n, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(x), self.n_heads)
        k, v = heads(self.k_proj(x), self.n_kv_heads), heads(self.v_proj(x), self.n_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        causal = mask is None
        if cache is not None:
            start = cache.start
            k, v = cache.append(k, v)
            if start and mask is None:
                # SDPA's is_causal aligns the triangle top-left, which is wrong once the keys
                # outnumber the queries; one new query needs no mask at all
                causal = False
                if seq > 1:
                    mask = offset_causal_mask(start, seq, x.device)
        gqa = self.n_kv_heads != self.n_heads
        if mask is not None and not isinstance(mask, Tensor):  # FlexAttention's block mask
            out = flex(q, k, v, mask, gqa)
        elif causal:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, dim))


def offset_causal_mask(start: int, seq: int, device: torch.device) -> Tensor:
    """Boolean [seq, start + seq]: query i (at position start + i) sees keys 0 ... start + i."""
    queries = torch.arange(start, start + seq, device=device)
    keys = torch.arange(start + seq, device=device)
    return keys[None, :] <= queries[:, None]


class MLP(nn.Module):
    """``down(act(up(x)))``, or ``down(act(gate(x), up(x)))`` for a gated activation."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.act_fn = get_activation(config.activation, **config.activation_kwargs)
        self.gated = config.gated
        self.gate_proj = nn.Linear(config.dim, config.hidden, bias=False) if self.gated else None
        self.up_proj = nn.Linear(config.dim, config.hidden, bias=False)
        self.down_proj = nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.down_proj(self.act_fn(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(self.act_fn(self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm residual block: attention, then MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | BlockMask | None = None,  # noqa: F821
        cache: LayerCache | None = None,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))
