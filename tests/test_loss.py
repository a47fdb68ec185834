"""The chunked LM-head cross-entropy against F.cross_entropy on full logits (float64)."""

import pytest
import torch
import torch.nn.functional as F

from model import Llama, ModelConfig
from model import loss as model_loss
from model.loss import chunk_loss_and_grad, gemm, linear_cross_entropy, token_scores


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
    """The bf16 GEMM rounds each logit once; everything after it is fp32. So the loss equals
    float64 cross-entropy of those bf16-rounded logits to fp32 rounding (2.5e-8 measured); a
    softmax in bf16 is 2.8e-3 off here."""
    hidden, weight, targets = problem()
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    bf16_logits = (hidden.float().flatten(0, 1) @ weight.float().t()).bfloat16().double()
    ref = F.cross_entropy(bf16_logits, targets.flatten())
    out = linear_cross_entropy(hidden, weight, targets)
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(ref.item(), rel=1e-6)


def test_the_weight_gradient_is_summed_over_chunks_in_fp32():
    """bf16 autocast, fp32 master weight, 64 chunks: each chunk's bf16 GEMM adds a rounding of
    its own (~2e-3 of the gradient's norm whatever the chunk count, measured), a bf16 running
    sum one of the growing total per chunk (1.1e-2 at 64 chunks)."""
    torch.manual_seed(0)
    hidden = torch.randn(512, 64).bfloat16().float().requires_grad_()
    weight = (0.1 * torch.randn(100, 64)).bfloat16().float().requires_grad_()
    targets = torch.full((512,), 3)  # every chunk pushes the same rows: the sum grows
    ref = F.cross_entropy(hidden.double() @ weight.double().t(), targets)
    (want,) = torch.autograd.grad(ref, weight)
    with torch.autocast("cpu", torch.bfloat16):
        out = linear_cross_entropy(hidden, weight, targets, chunk_size=8)
    (got,) = torch.autograd.grad(out, weight)
    assert got.dtype == torch.float32
    assert float((got.double() - want).norm() / want.norm()) < 4e-3


def test_all_targets_ignored_gives_zero_loss_and_zero_gradients():
    hidden, weight, targets = problem()
    out = linear_cross_entropy(hidden, weight, torch.full_like(targets, -100))
    out.backward()
    assert out.item() == 0 and hidden.grad.abs().max() == 0 and weight.grad.abs().max() == 0


@pytest.mark.parametrize("chunk", [1, 4096])
def test_one_counted_target_is_a_mean_over_one_token(chunk):
    """The mean divides by the number of counted targets, whatever it is: one is one."""
    hidden, weight, targets = problem()
    targets = torch.full_like(targets, -100)
    targets[1, 20] = 5
    ref = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten())
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    out = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out, (hidden, weight))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


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


@pytest.mark.parametrize("chunk", [1, 13, 4096])
def test_token_scores_equal_the_full_log_softmax_and_argmax(chunk):
    hidden, weight, targets = problem()
    targets[1, 3] = int((hidden[1, 3] @ weight.t()).argmax())  # one target surely greedy
    logprobs, greedy = token_scores(hidden, weight, targets, chunk_size=chunk)
    full = torch.log_softmax(hidden.detach() @ weight.detach().t(), dim=-1)
    valid = targets != -100
    want = torch.where(valid, full.gather(-1, targets.clamp(min=0)[..., None])[..., 0], 0.0)
    torch.testing.assert_close(logprobs, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(greedy, (full.argmax(-1) == targets) | ~valid)
    assert greedy[1, 3] and greedy[0, :7].all() and not greedy.all()
    # the mean of the scores is the loss, as the fused loss computes it
    loss = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk)
    torch.testing.assert_close(-logprobs.sum() / valid.sum(), loss.detach(), rtol=1e-12, atol=0)


def test_the_models_per_token_scores_equal_the_log_softmax_of_its_logits():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, gated_hidden=48, loss_chunk_tokens=7
    )
    model = Llama(config).double().eval()
    tokens = torch.randint(0, 64, (2, 21))
    targets = tokens[:, 1:].clone()
    targets[0, :5] = -100
    with torch.no_grad():
        logprobs, greedy = model(tokens[:, :-1], targets, per_token=True)
        full = torch.log_softmax(model(tokens[:, :-1]), dim=-1)
    want = full.gather(-1, targets.clamp(min=0)[..., None])[..., 0] * (targets != -100)
    torch.testing.assert_close(logprobs, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(greedy, (full.argmax(-1) == targets) | (targets == -100))


def test_evaluation_under_no_grad_gives_the_same_loss_without_gradient_work():
    hidden, weight, targets = problem()
    with_grad = linear_cross_entropy(hidden, weight, targets, chunk_size=13)
    with torch.no_grad():
        without = linear_cross_entropy(hidden, weight, targets, chunk_size=13)
    assert without.grad_fn is None and torch.equal(without, with_grad.detach())


@pytest.mark.slow
@pytest.mark.mutation
def test_compiled_chunk_math_equals_the_full_logits_reference(fresh_dynamo):
    from torch._dynamo.utils import counters

    hidden, weight, targets = problem()
    ref = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten())
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    frames = counters["frames"]["ok"]
    # 150 tokens in chunks of 64: two full chunks and a shorter last one
    out = linear_cross_entropy(hidden, weight, targets, chunk_size=64, compiled=True)
    grads = torch.autograd.grad(out, (hidden, weight))
    assert counters["frames"]["ok"] > frames  # compiled, not run eagerly behind our back
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # evaluation: the gradient-free variant
        torch.testing.assert_close(
            linear_cross_entropy(hidden, weight, targets, chunk_size=64, compiled=True),
            ref.detach(),
            rtol=1e-12,
            atol=1e-12,
        )


def bf16_autocast_eager_then_compiled(hidden, weight, targets):
    """The loss and its gradients under bf16 autocast, asked for eagerly and then compiled,
    each with whether anything was compiled during its call."""
    from torch._dynamo.utils import counters

    results, compiled_any = [], []
    for compiled in (False, True):
        frames = counters["frames"]["ok"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = linear_cross_entropy(hidden, weight, targets, chunk_size=64, compiled=compiled)
        results.append((out, *torch.autograd.grad(out, (hidden, weight))))
        compiled_any.append(counters["frames"]["ok"] > frames)
    return results, compiled_any


@pytest.mark.slow  # 8 s: Dynamo compiles the chunk for bf16
def test_compiled_chunk_math_under_bf16_autocast_matches_the_eager_one(fresh_dynamo, monkeypatch):
    # the GPU's path: bf16 GEMMs in bf16, so the chunk's math is compiled
    monkeypatch.setattr(model_loss, "BF16_GEMMS_IN_FP32_ON_CPU", False)
    hidden, weight, targets = (t.float() if t.is_floating_point() else t for t in problem())
    results, compiled_any = bf16_autocast_eager_then_compiled(hidden, weight, targets)
    assert compiled_any == [False, True]
    (eager, *eager_grads), (fused, *fused_grads) = results
    assert fused.dtype == eager.dtype == torch.float32
    torch.testing.assert_close(fused, eager, rtol=1e-6, atol=1e-6)  # fp32 sums, other order
    for got, want in zip(fused_grads, eager_grads, strict=True):
        assert got.dtype == want.dtype == torch.float32
        # d loss/d logits is rounded to bf16 either way; an exp a few ulp apart may round to
        # the neighbouring bf16 value
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-2 * want.abs().max().item())


def test_on_a_cpu_a_bf16_heads_chunk_runs_eagerly_where_compiling_is_asked(fresh_dynamo):
    """Compiled code cannot take ``gemm``'s fp32 path for a bf16 product on a CPU, and the
    bf16 GEMM it would run is slower than the whole eager chunk: the same numbers as the
    eager call, bit for bit, and nothing compiled."""
    from torch._dynamo.utils import counters

    hidden, weight, targets = (t.float() if t.is_floating_point() else t for t in problem())
    results, compiled_any = bf16_autocast_eager_then_compiled(hidden, weight, targets)
    assert compiled_any == [False, False]
    for eager, asked_compiled in zip(*results, strict=True):
        assert torch.equal(eager, asked_compiled)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):  # fp32: compiled as asked
        frames = counters["frames"]["ok"]
        linear_cross_entropy(hidden, weight, targets, chunk_size=64, compiled=True)
        assert counters["frames"]["ok"] > frames


def test_the_target_entry_of_the_gradient_is_rounded_once_from_fp32():
    # a confident model: softmax ~ 1 at the target, so d loss/d logit there is a tiny negative
    # number; softmax rounded to bf16 first would give 1 - 1 = 0 there
    logits = torch.full((1, 8), -2.0)
    logits[0, 3] = 8.0  # softmax 0.99968 there, which bf16 rounds to 1
    identity = torch.eye(8, dtype=torch.bfloat16)  # h @ I.T: the logits themselves, exactly
    _, dlogits = chunk_loss_and_grad(
        logits.bfloat16(), identity, torch.tensor([3]), torch.tensor([True]), torch.tensor([1.0])
    )
    exact = torch.softmax(logits.double(), -1)[0, 3] - 1
    assert dlogits.dtype == torch.bfloat16
    assert dlogits[0, 3].item() == pytest.approx(exact.item(), rel=1e-2)
    assert exact.item() < 0


def test_fp16_is_refused_with_a_clear_error_rather_than_silently_imprecise():
    """The chunk gradients are already divided by the token count when they are rounded to the
    matmul dtype; in fp16, with no loss scaling possible at that point, that loses precision
    (5-7% off with a 65536 scale), so fp16 inputs or fp16 autocast are refused."""
    hidden, weight, targets = problem(torch.float32)
    with pytest.raises(ValueError, match=r"does not support fp16.*bf16"):
        linear_cross_entropy(hidden.half(), weight.half(), targets)
    fp16 = torch.autocast("cpu", torch.float16)
    with pytest.raises(ValueError, match="does not support fp16"), fp16:
        linear_cross_entropy(hidden, weight, targets)


@pytest.mark.parametrize("chunk", [1, 13, 150])
def test_z_loss_value_and_gradients_equal_float64_autograd_of_the_full_logits(chunk):
    """z * mean over counted rows of logsumexp(logits)^2 (PaLM), on top of cross-entropy; its
    gradient comes from the same pass over each chunk. 150 rows: 13 does not divide them."""
    hidden, weight, targets = problem()
    z = 1e-2  # large, so that a wrong z term shows far above rounding
    logits = (hidden @ weight.t()).flatten(0, 1)
    counted = targets.flatten() != -100
    lse = torch.logsumexp(logits, dim=-1)[counted]
    ref = F.cross_entropy(logits, targets.flatten()) + z * (lse**2).mean()
    ref_grads = torch.autograd.grad(2.5 * ref, (hidden, weight))
    out = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk, z_loss=z)
    grads = torch.autograd.grad(2.5 * out, (hidden, weight))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)
    plain = linear_cross_entropy(hidden, weight, targets, chunk_size=chunk)
    assert float(out - plain) == pytest.approx(z * float((lse**2).mean()), rel=1e-9)


def test_the_model_adds_the_z_loss_it_is_handed_and_none_by_default():
    """The trainer hands ``loss.z_loss`` to its training steps; validation and evaluation call
    the model without it, so their loss is the plain cross-entropy."""
    config = ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, gated_hidden=32)
    torch.manual_seed(0)
    model = Llama(config)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    plain = model(tokens, tokens)
    with torch.no_grad():
        lse = torch.logsumexp(model(tokens).double(), -1)
    assert float(model(tokens, tokens, z_loss=0.5)) == pytest.approx(
        float(plain) + 0.5 * float((lse**2).mean()), rel=1e-5
    )
    assert float(model.eval()(tokens, tokens)) == pytest.approx(float(plain), rel=1e-6)


def test_a_cpu_bf16_gemm_is_the_exact_product_rounded_once_to_bf16_under_autocast_too():
    """``gemm`` takes a CPU bf16 product in fp32 (bf16 GEMMs are slow there): the result must
    still be a bf16 GEMM's, the exact product rounded once to bf16, with autocast on or off."""
    a = torch.randn(16, 4096).bfloat16()
    b = torch.randn(4096, 8).bfloat16()
    exact = a.double() @ b.double()
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got = gemm(a, b)
        assert got.dtype == torch.bfloat16
        # fp32 sums of 4096 terms, then one rounding: within one bf16 ulp of the exact value
        ulp = exact.abs() * 2.0**-7
        assert ((got.double() - exact).abs() <= ulp).all()
        assert (got == exact.bfloat16()).float().mean() > 0.95
