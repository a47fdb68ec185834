"""Goldfish loss and the end-of-document mask: which targets leave the loss, and the step's mean
over the global batch's counted targets."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from data.packing import IGNORE_INDEX
from model import Llama, ModelConfig
from train_helpers import with_setting
from training.checks import check_config
from training.config import ExperimentConfig
from training.errors import ConfigError
from training.loss_mask import (
    HASH_BASE,
    HASH_MODULUS,
    LossMask,
    goldfish_dropped,
    goldfish_table,
    goldfish_table_dropped,
)
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize
from training.step import token_weights, train_step


def random_ids(batch: int, seq: int, seed: int = 0, vocab: int = 50_000) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("k", "h"), [(2, 3), (7, 13), (50, 50)])
def test_goldfish_drops_one_in_k_of_random_tokens(k, h):
    ids = random_ids(64, 1024)
    dropped = goldfish_dropped(ids, k, h)
    eligible = dropped[:, h - 1 :]
    n = eligible.numel()
    sigma = math.sqrt(n * (1 / k) * (1 - 1 / k))
    assert abs(int(eligible.sum()) - n / k) < 5 * sigma
    assert not dropped[:, : h - 1].any()  # fewer than h ids before them: kept (module doc)


def test_the_hash_is_the_polynomial_of_the_h_preceding_ids():
    """Python's integers, no overflow possible: the drop decision of target j is
    sum_m (id_{j-h+1+m} + 1) B^(h-1-m) mod M, divisible by k."""
    k, h = 3, 5
    ids = random_ids(2, 40, seed=1)
    dropped = goldfish_dropped(ids, k, h)
    for row in range(2):
        for j in range(h - 1, 40):
            context = ids[row, j - h + 1 : j + 1].tolist()
            value = sum((t + 1) * HASH_BASE ** (h - 1 - m) for m, t in enumerate(context))
            assert bool(dropped[row, j]) == (value % HASH_MODULUS % k == 0), (row, j)


def int64(value: int) -> int:
    """A Python integer as int64 arithmetic leaves it: wrapped into [-2^63, 2^63)."""
    return (value + 2**63) % 2**64 - 2**63


def test_the_table_rule_is_the_product_of_the_h_labels_ending_at_the_target():
    """The rule of the code Apertus trained with, written out: the key of target j is the
    int64 product of targets j-h+1..j, mod 1,000,003 (Python's mod: never negative); dropped
    when the table holds less than 1/k there; the first h - 1 targets never."""
    k, h = 4, 3
    targets = random_ids(3, 60, seed=6, vocab=131_072)
    targets[1, 10:30] = 2  # a repeat: the same key over and over
    dropped = goldfish_table_dropped(targets, k, h)
    table = goldfish_table()
    for row in range(3):
        for j in range(60):
            if j < h - 1:
                assert not dropped[row, j]
                continue
            product = 1
            for t in targets[row, j - h + 1 : j + 1].tolist():
                product = int64(product * t)
            key = product % 1_000_003
            assert bool(dropped[row, j]) == (float(table[key]) < 1 / k), (row, j)


def test_the_table_rule_overflows_as_int64_does_and_its_table_is_the_seeded_one():
    """50 even ids gather more than 64 factors of two: the product wraps to 0, key 0."""
    targets = torch.full((1, 60), 6)  # 6^50: 2^50 * 3^50, past int64 many times over
    product = 1
    for _ in range(50):
        product = int64(product * 6)
    key = product % 1_000_003
    dropped = goldfish_table_dropped(targets, 50, 50)[0, 49:]
    assert bool(dropped.all()) == (float(goldfish_table()[key]) < 1 / 50)
    assert len(set(dropped.tolist())) == 1  # one key, one decision
    table = goldfish_table()
    assert table.shape == (1_000_003,) and table.dtype == torch.float32
    again = torch.rand(1_000_003, generator=torch.Generator().manual_seed(2_971_215_073))
    assert torch.equal(table, again)


def test_the_mask_follows_the_rule_it_is_given():
    ids = random_ids(2, 200, seed=7, vocab=1000)
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}
    table = LossMask(5, 4, False, 0).apply(batch)["targets"] == IGNORE_INDEX
    paper = LossMask(5, 4, False, 0, goldfish_rule="paper").apply(batch)["targets"]
    assert torch.equal(table, goldfish_table_dropped(batch["targets"], 5, 4))
    assert torch.equal(paper == IGNORE_INDEX, goldfish_dropped(batch["inputs"], 5, 4))
    assert not torch.equal(table, paper == IGNORE_INDEX)


def test_the_same_text_drops_the_same_tokens_however_it_is_cut_into_windows():
    """A stream cut at other places (another sequence length, another world size's or a
    resume's split of the windows, another micro-batch) drops the same targets wherever a
    target has its h ids before it in its window."""
    k, h = 4, 8
    stream = random_ids(1, 3000, seed=2)[0]

    def decisions(seq: int, offset: int) -> dict[int, bool]:
        out = {}
        for start in range(offset, len(stream) - seq, seq):
            window = stream[start : start + seq + 1]
            dropped = goldfish_dropped(window[None, :-1], k, h)[0]
            for j in range(h - 1, seq):
                out[start + j + 1] = bool(dropped[j])  # keyed by the target's place in the text
        return out

    cuts = [decisions(100, 0), decisions(64, 5), decisions(257, 31)]
    common = set.intersection(*(set(cut) for cut in cuts))
    assert len(common) > 1000
    for position in common:
        assert cuts[0][position] == cuts[1][position] == cuts[2][position], position
    # and the batch dimension changes nothing: rows alone or together
    rows = random_ids(6, 200, seed=3)
    together = goldfish_dropped(rows, k, h)
    alone = torch.cat([goldfish_dropped(rows[i : i + 1], k, h) for i in range(6)])
    assert torch.equal(together, alone)


def test_the_end_of_document_mask_leaves_out_the_positions_whose_input_is_eos():
    inputs = torch.tensor([[5, 9, 2, 7, 2, 2, 8]])
    targets = torch.tensor([[9, 2, 7, 2, 2, 8, 3]])
    batch = {"inputs": inputs, "targets": targets, "document_ids": torch.zeros_like(inputs)}
    out = LossMask(0, 50, True, eos_id=2).apply(batch)
    assert out["targets"].tolist() == [[9, 2, -100, 2, -100, -100, 3]]
    assert out["document_ids"] is batch["document_ids"]
    assert torch.equal(batch["targets"], targets)  # the batch itself is not changed
    assert not LossMask(0, 50, False, eos_id=2).active


def test_goldfish_k_1_and_bad_h_are_refused_naming_the_key():
    config = ExperimentConfig()
    with pytest.raises(ConfigError, match=r"loss\.goldfish_k=1 would leave every target out"):
        check_config(with_setting(config, "loss.goldfish_k", 1))
    config = with_setting(config, "loss.goldfish_k", 50)
    with pytest.raises(ConfigError, match=r"loss\.goldfish_h must be positive"):
        check_config(with_setting(config, "loss.goldfish_h", 0))
    # no target has that many ids before it: refused against the data's, when the run starts
    config = with_setting(config, "loss.goldfish_h", config.data.seq_len)
    with pytest.raises(ConfigError, match=r"loss\.goldfish_h=\d+ is not below data\.seq_len"):
        check_config(config)


def test_token_weights_are_exactly_one_when_every_micro_batch_counts_the_same():
    assert token_weights([128, 128, 128], 6, 768.0) == [1.0, 1.0, 1.0]
    weights = token_weights([10, 30], 2, 40.0)
    assert weights == [0.5, 1.5]
    assert token_weights([0, 0], 2, 0.0) == [0.0, 0.0]  # nothing counted: no loss, no nan


def tiny() -> Llama:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=96, dim=16, n_layers=2, n_heads=2, gated_hidden=32)
    return Llama(config).double()


def one_step(model: Llama, batch: dict, accumulation: int, loss_mask: LossMask):
    """One step of ``train_step`` with SGD at rate 1: the update is minus the gradient."""
    trained = parallelize(model, Env(0, 1, 0, torch.device("cpu")), ParallelConfig())
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    size = batch["inputs"].shape[0] // accumulation
    micro = iter(
        [
            {key: value[i * size : (i + 1) * size] for key, value in batch.items()}
            for i in range(accumulation)
        ]
    )
    result = train_step(trained, optimizer, micro, accumulation, 0.0, loss_mask=loss_mask)
    loss = float(result.loss_sum) / accumulation
    gradient = [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]
    return loss, gradient, result.measured


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_the_step_loss_is_the_hand_masked_cross_entropy_of_the_global_batch(accumulation):
    """Goldfish and the EOD mask leave different counts in each micro-batch; the step's loss
    and gradient are still those of one cross-entropy over every counted target of the batch
    (computed here from full logits, masked by hand), with 1, 2 or 4 micro-batches."""
    eos, k, h = 3, 3, 4
    ids = random_ids(4, 33, seed=4, vocab=12)  # a small vocabulary: EOS is frequent
    ids[0, 5:20] = 7  # one row with a long repeat: its hashes repeat, its counts differ
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}
    mask = LossMask(k, h, True, eos, goldfish_rule="paper")
    keep = ~(goldfish_dropped(batch["inputs"], k, h) | (batch["inputs"] == eos))
    counts = keep.sum(dim=1)
    assert len(set(counts.tolist())) > 1  # the rows count differently: the weights matter

    reference_model = tiny()
    logits = reference_model(batch["inputs"])
    hand_targets = torch.where(keep, batch["targets"], IGNORE_INDEX)
    reference = F.cross_entropy(logits.flatten(0, 1), hand_targets.flatten())
    reference_grads = torch.autograd.grad(reference, list(reference_model.parameters()))

    loss, gradient, measured = one_step(tiny(), batch, accumulation, mask)
    # RMSNorm's statistics are fp32 whatever the model's dtype: split micro-batches round
    # there differently; a mean of the micro-batches' means would be off by percents
    assert loss == pytest.approx(float(reference.detach()), rel=1e-7)
    for got, want in zip(gradient, reference_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-10)
    assert measured["loss_mask/dropped"] == pytest.approx(1 - float(counts.sum()) / keep.numel())


def test_without_a_mask_the_step_takes_the_plain_path_bit_for_bit():
    ids = random_ids(4, 17, seed=5, vocab=96)
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}
    plain = one_step(tiny(), copy.deepcopy(batch), 2, LossMask(0, 50, False, 3))
    unmasked = one_step(tiny(), copy.deepcopy(batch), 2, None)
    assert plain[0] == unmasked[0] and plain[2] == unmasked[2] == {}
    for a, b in zip(plain[1], unmasked[1], strict=True):
        assert torch.equal(a, b)
