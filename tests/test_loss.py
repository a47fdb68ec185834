"""The chunked LM-head cross-entropy against F.cross_entropy on full logits (float64)."""

import pytest
import torch
import torch.nn.functional as F

from model import Llama, ModelConfig
from model.loss import linear_cross_entropy


def problem(dtype=torch.float64):
    torch.manual_seed(0)
    hidden = torch.randn(3, 50, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(97, 16, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, 97, (3, 50))
    targets[0, :7] = -100  # ignored positions (e.g. across a document boundary)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 13, 150, 4096])
def test_value_and_gradients_equal_the_full_logits_reference(chunk):
    hidden, weight, targets = problem()
    ref = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten())
    ref_grads = torch.autograd.grad(2.5 * ref, (hidden, weight))
    out = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk)
    grads = torch.autograd.grad(2.5 * out, (hidden, weight))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bf16_inputs_keep_fp32_softmax_accuracy():
    hidden, weight, targets = problem()
    ref = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten())
    out = linear_cross_entropy(hidden.bfloat16(), weight.bfloat16(), targets)
    assert out.dtype == torch.float32
    assert abs(out.item() - ref.item()) < 0.05 * ref.item()  # bf16 matmul inputs, fp32 softmax


def test_all_targets_ignored_gives_zero_loss_and_zero_gradients():
    hidden, weight, targets = problem()
    out = linear_cross_entropy(hidden, weight, torch.full_like(targets, -100))
    out.backward()
    assert out.item() == 0 and hidden.grad.abs().max() == 0 and weight.grad.abs().max() == 0


def test_model_loss_equals_cross_entropy_of_its_logits_with_tied_head():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64,
        dim=32,
        n_layers=2,
        n_heads=4,
        gated_hidden=48,
        max_seq_len=32,
        loss_chunk_tokens=7,
    )
    model = Llama(config).double()
    tokens = torch.randint(0, 64, (2, 21))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    ref = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    got = torch.autograd.grad(loss, model.embed_tokens.weight)[0]
    want = torch.autograd.grad(ref, model.embed_tokens.weight)[0]
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_evaluation_under_no_grad_gives_the_same_loss_without_gradient_work():
    hidden, weight, targets = problem()
    with_grad = linear_cross_entropy(hidden, weight, targets, chunk_size=13)
    with torch.no_grad():
        without = linear_cross_entropy(hidden, weight, targets, chunk_size=13)
    assert without.grad_fn is None and torch.equal(without, with_grad.detach())
