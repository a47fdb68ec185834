"""Attention within documents: FlexAttention against the dense-mask reference, forward and
gradients, eager and compiled, grouped-query attention, the model and selective checkpointing.

FlexAttention has no backward on a CPU (torch 2.13 refuses it): here the forward is checked on
the CPU and, with CUDA, on the GPU; the gradients only on the GPU (``-m gpu``, run by
``bash scripts/gpu_checks.sh tests``). The trainer refuses ``model.attention=flex`` on a CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from model import Llama, ModelConfig
from model.document_attention import block_mask, dense_mask, document_mask, flex, kernel_for
from scripts.bench.attention import document_ids
from training.checks import check_on_device
from training.config import ExperimentConfig
from training.errors import ConfigError
from training.runtime.parallelize import apply_activation_checkpointing, matmul_policy


def packed_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """Document ids of windows holding several documents of random lengths (about 20 tokens)."""
    return document_ids(batch, seq, mean_tokens=20, seed=seed)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
GPU = [pytest.mark.gpu, CUDA]


def qkv(batch, heads, kv_heads, seq, dim, dtype, device="cpu", grad=False, seed=1):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, seq, dim), (batch, kv_heads, seq, dim), (batch, kv_heads, seq, dim)]
    return [torch.randn(s, generator=gen).to(device, dtype).requires_grad_(grad) for s in shapes]


def reference(q, k, v, ids):
    """Dense-mask SDPA in float64, key/value heads repeated for their groups."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q.double(), k64, v64, attn_mask=dense_mask(ids))


def assert_same_gradients(out, want, inputs, tolerance: float) -> None:
    """Gradients of ``out`` and of its float64 reference ``want`` for one random upstream."""
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, upstream)
    expected = torch.autograd.grad(want, inputs, upstream.double())
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.double(), e, rtol=tolerance, atol=tolerance)


@pytest.mark.slow  # Inductor builds flex's CPU kernel (3.7 s warm; more on a cold cache)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("compiled", [False, True])
def test_flex_equals_the_dense_mask_reference(device, kv_heads, compiled):
    ids = packed_ids(2, 128).to(device)
    grad = device == "cuda"
    q, k, v = qkv(2, 4, kv_heads, 128, 16, torch.float32, device, grad)
    mask = block_mask(ids)
    gqa = kv_heads != 4
    if compiled:
        out = flex(q, k, v, mask, gqa)  # the kernel the model runs: compiled
    else:
        out = flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
    want = reference(q, k, v, ids)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    if grad:  # no backward on a CPU
        assert_same_gradients(out, want, (q, k, v), tolerance=1e-5)


@pytest.mark.slow  # compiles flex's bf16 kernel
@pytest.mark.parametrize("device", DEVICES)
def test_flex_in_bf16_is_within_bf16s_rounding_of_the_reference(device):
    ids = packed_ids(2, 128, seed=3).to(device)
    grad = device == "cuda"
    q, k, v = qkv(2, 4, 2, 128, 16, torch.bfloat16, device, grad)
    out = flex(q, k, v, block_mask(ids), True)
    want = reference(q, k, v, ids)
    # bf16 keeps 8 bits: a relative error of 2^-8 per rounding, a few roundings deep
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
    if grad:
        assert_same_gradients(out, want, (q, k, v), tolerance=5e-2)


def tiny(attention: str, **overrides) -> Llama:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=96,
        dim=32,
        n_layers=2,
        n_heads=4,
        gated_hidden=64,
        max_seq_len=128,
        attention=attention,
        **overrides,
    )
    return Llama(config)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2, "qk_norm": True}])
def test_the_model_with_flex_gives_the_dense_masks_logits(overrides):
    tokens = torch.randint(0, 96, (2, 64), generator=torch.Generator().manual_seed(4))
    ids = packed_ids(2, 64, seed=5)
    with torch.no_grad():
        dense = tiny("sdpa", **overrides)(tokens, document_ids=ids)
        flexed = tiny("flex", **overrides)(tokens, document_ids=ids)
    torch.testing.assert_close(flexed, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2, "qk_norm": True}])
@pytest.mark.parametrize("selective", [False, True])
@pytest.mark.gpu
@CUDA
def test_the_model_with_flex_gives_the_dense_masks_loss_and_gradients(overrides, selective):
    """On the GPU, with and without selective checkpointing (flex's output kept)."""
    tokens = torch.randint(0, 96, (2, 65), generator=torch.Generator().manual_seed(4)).cuda()
    ids = packed_ids(2, 64, seed=5).cuda()
    results = []
    for attention in ("sdpa", "flex"):
        model = tiny(attention, **overrides).cuda()
        if selective and attention == "flex":
            apply_activation_checkpointing(model, selective=True)
        loss = model(tokens[:, :-1], tokens[:, 1:], ids)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (dense_loss, dense_grads), (flex_loss, flex_grads) = results
    torch.testing.assert_close(flex_loss, dense_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(flex_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_both_masks_let_a_position_see_the_earlier_positions_of_its_own_document_only():
    """The dense mask is the reference the flex tests compare with, so both are checked here
    against the rule written out position by position (and quickly: no kernel runs)."""
    ids = torch.tensor([[0, 0, 1, 1, 1, 2], [5, 6, 6, 6, 6, 6]])
    batch, seq = ids.shape
    expected = torch.tensor(
        [
            [[j <= i and ids[b, i] == ids[b, j] for j in range(seq)] for i in range(seq)]
            for b in range(batch)
        ]
    )
    assert torch.equal(dense_mask(ids), expected[:, None])
    mask = block_mask(ids)
    assert mask.shape == (batch, 1, seq, seq)
    b, q, kv = torch.arange(batch), torch.arange(seq), torch.arange(seq)
    every_pair = mask.mask_mod(b[:, None, None], 0, q[None, :, None], kv[None, None, :])
    assert torch.equal(every_pair, expected)


def test_selective_checkpointing_keeps_flexs_output():
    from torch.utils.checkpoint import CheckpointPolicy

    class Context:
        is_recompute = False

    policy = matmul_policy(7)
    assert policy(Context(), torch.ops.higher_order.flex_attention) == CheckpointPolicy.MUST_SAVE


def test_the_trainer_refuses_flex_on_a_cpu_naming_the_key():
    config = ExperimentConfig()
    config.model.attention, config.data.document_mask = "flex", True
    with pytest.raises(ConfigError, match=r"model\.attention=flex .* no backward on a CPU"):
        check_on_device(config, torch.device("cpu"))
    check_on_device(config, torch.device("cuda"))
    config.model.attention = "auto"
    check_on_device(config, torch.device("cpu"))


def test_auto_picks_flex_on_a_gpu_and_the_dense_mask_on_a_cpu():
    assert kernel_for("auto", torch.device("cuda")) == "flex"
    assert kernel_for("auto", torch.device("cpu")) == "sdpa"
    assert kernel_for("flex", torch.device("cpu")) == "flex"
    ids = packed_ids(1, 16)
    assert isinstance(document_mask(ids, "sdpa"), torch.Tensor)
    assert not isinstance(document_mask(ids, "flex"), torch.Tensor)
    with pytest.raises(ValueError, match=r"model\.attention='fast' is not one of auto, sdpa, flex"):
        ModelConfig(attention="fast")
