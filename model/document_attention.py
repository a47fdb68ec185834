"""Attention that stays inside each packed document: FlexAttention, or a dense mask as reference.

With ``data.document_mask`` each batch carries per-position document ids, and a position may
attend only to earlier positions of its own document (Apertus: ``--reset-attention-mask``).

- ``flex`` (``torch.nn.attention.flex_attention``): a block mask built once per forward from the
  ids; the kernel skips every tile outside the documents and never materialises a score matrix,
  so it keeps a flash kernel's memory and, the more documents a window holds, does less work
  than full causal attention. Compiled (``torch.compile`` of the kernel; inside an already
  compiled block it is traced with the block), as FlexAttention is only fast compiled.
- ``sdpa``: a dense boolean [batch, 1, seq, seq] mask through ``scaled_dot_product_attention``,
  which sends a masked call to a slower kernel (the math or memory-efficient one on a GPU) and
  holds seq^2 booleans per sequence: the reference that ``flex`` is tested against.
- ``auto``: ``flex`` on a GPU; on a CPU the dense mask, since torch 2.13's FlexAttention has no
  backward there (its forward is faster than the dense mask's from 2048 tokens on:
  ``python -m scripts.bench.attention``, docs/performance.md).

Without document ids attention is plain causal SDPA whatever the setting: its flash kernels
are the fastest there is for that mask.

RoPE is relative: restarting positions at each document would change nothing under this mask,
so there is no setting for it (docs/model.md).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # importing FlexAttention imports Dynamo (a second): only when it is used
    from torch.nn.attention.flex_attention import BlockMask

KERNELS = ("auto", "sdpa", "flex")


def kernel_for(setting: str, device: torch.device) -> str:
    """``sdpa`` or ``flex`` for ``model.attention`` on ``device`` (module doc)."""
    if setting != "auto":
        return setting
    return "flex" if device.type == "cuda" else "sdpa"


def dense_mask(document_ids: Tensor) -> Tensor:
    """Boolean [batch, 1, seq, seq]: causal and within one document."""
    seq = document_ids.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=document_ids.device).tril()
    same_document = document_ids[:, :, None] == document_ids[:, None, :]
    return (causal & same_document)[:, None]


def block_mask(document_ids: Tensor) -> BlockMask:
    """FlexAttention's block mask for causal attention within each document, built eagerly,
    outside any compiled region, once per forward."""
    return _eager(_block_mask)(document_ids)


@functools.cache
def _eager(function):
    return torch.compiler.disable(function)


def _block_mask(document_ids: Tensor) -> BlockMask:
    from torch.nn.attention.flex_attention import create_block_mask

    batch, seq = document_ids.shape

    def within_document(b, h, q, kv):
        return (q >= kv) & (document_ids[b, q] == document_ids[b, kv])

    # compiled on a GPU: eagerly it evaluates the mask at every (query, key) pair, a [batch,
    # seq, seq] tensor (84 MB at the paper's 5 x 4096); a CPU (evaluation only) keeps it eager
    return create_block_mask(
        within_document,
        batch,
        None,
        seq,
        seq,
        device=document_ids.device,
        _compile=document_ids.is_cuda,
    )


def document_mask(document_ids: Tensor, setting: str) -> Tensor | BlockMask:
    """The mask ``Attention`` takes for ``document_ids`` under ``model.attention=setting``."""
    if kernel_for(setting, document_ids.device) == "flex":
        return block_mask(document_ids)
    return dense_mask(document_ids)


def flex(q: Tensor, k: Tensor, v: Tensor, mask: BlockMask, gqa: bool) -> Tensor:
    """FlexAttention over [batch, heads, seq, head_dim] queries, keys and values."""
    from torch.nn.attention.flex_attention import flex_attention

    kernel = flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention()
    return kernel(q, k, v, block_mask=mask, enable_gqa=gqa)


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)
