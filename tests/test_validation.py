"""The validation loss is token-weighted: every counted target weighs the same, whichever batch
it sits in and however many of its neighbours are ignored (document boundaries, padding)."""

import pytest
import torch
import torch.nn.functional as F

from data import IGNORE_INDEX
from model import Llama, ModelConfig
from training.instruments.validation import validation_loss


def test_the_loss_is_cross_entropy_over_the_concatenated_counted_targets():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=50, dim=16, n_layers=1, n_heads=2, gated_hidden=32, max_seq_len=12
    )
    model = Llama(config).double().eval()
    with torch.no_grad():  # away from init, so that per-token losses spread widely
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    batches = []
    for ignored in (0, 5, 11):  # 24, 19 and 13 counted targets: unequal weights per batch
        inputs = torch.randint(0, 50, (2, 12))
        targets = torch.randint(0, 50, (2, 12))
        targets[0, :ignored] = IGNORE_INDEX
        batches.append({"inputs": inputs, "targets": targets})

    result = validation_loss(model, batches, torch.device("cpu"), (2, 12))

    with torch.no_grad():
        logits = torch.cat([model(b["inputs"]).flatten(0, 1) for b in batches])
    targets = torch.cat([b["targets"].flatten() for b in batches])
    expected = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
    assert result["tokens"] == 24 + 19 + 13
    assert result["loss"] == pytest.approx(float(expected), rel=1e-12)
    assert result["perplexity"] == pytest.approx(float(expected.exp()), rel=1e-12)
    with torch.no_grad():
        per_batch_mean = sum(float(model(b["inputs"], b["targets"])) for b in batches) / 3
    assert abs(per_batch_mean - result["loss"]) > 0.05  # the data tell the two means apart
