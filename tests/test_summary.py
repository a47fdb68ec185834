"""The closing lines of a run: validation loss against the unigram entropy, a sample, and the
commands to run next."""

import json
import math
from dataclasses import replace

import pytest
import torch

from data import TokenizerConfig, load_tokenizer
from model import Llama, ModelConfig
from train_helpers import compose
from training.summary import SAMPLE_PROMPT, run_summary, unigram_entropy


def batch(*rows: list[int]) -> dict:
    targets = torch.tensor(rows)
    return {"inputs": torch.zeros_like(targets), "targets": targets}


def test_unigram_entropy_is_that_of_the_target_histogram_without_ignored_targets():
    # counts: token 1 three times, token 2 three times, token 3 once (the -100s are padding)
    batches = [batch([1, 1, 2, -100]), batch([3, 1, 2, 2], [-100, -100, -100, -100])]
    by_hand = -(2 * (3 / 7) * math.log(3 / 7) + (1 / 7) * math.log(1 / 7))
    assert unigram_entropy(batches) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(1.0042424730540764)
    assert unigram_entropy([batch([0, 1, 2, 3])]) == pytest.approx(math.log(4))
    assert unigram_entropy([batch([5, 5, 5])]) == 0.0
    assert math.isnan(unigram_entropy([])) and math.isnan(unigram_entropy([batch([-100])]))


@pytest.fixture
def tiny(tmp_path):
    config, _ = compose([f"trainer.run_dir={tmp_path}", "data.tokenizer.name=bytes"])
    tokenizer = load_tokenizer(config.data.tokenizer)
    torch.manual_seed(0)
    model = Llama(ModelConfig(vocab_size=384, dim=32, n_layers=1, n_heads=2, max_seq_len=256))
    return model, tokenizer, config


def test_the_summary_compares_the_loss_with_the_entropy_samples_and_says_what_next(tiny, tmp_path):
    model, tokenizer, config = tiny
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 50, "val/loss": 2.9})
        + "\n"
        + json.dumps({"step": 100, "val/loss": 1.5})
    )
    batches = [batch(list(b"hello world, hello there"))]
    lines = run_summary(model.train(), tokenizer, batches, tmp_path, config, max_new_tokens=8)
    entropy = unigram_entropy(batches)
    assert lines[0].startswith(f"validation loss 1.500 nats/token ({1.5 / math.log(2):.2f} bits")
    assert f"vs {entropy:.3f} for the unigram entropy" in lines[0]
    assert "predicts from context" in lines[0]
    assert lines[1].startswith("sample (") and json.dumps(SAMPLE_PROMPT)[:-1] in lines[1]
    assert model.training, "the summary leaves the model in the mode it found it"
    text = "\n".join(lines)
    for command in (
        f"python -m scripts.plot_curves {tmp_path}/curves.png {tmp_path}",
        f"python -m eval.perplexity {tmp_path}",
        f"python -m eval.generate {tmp_path} --prompt",
        f"python -m scripts.export_hf {tmp_path}/hf --run-dir {tmp_path} --check",
        "torchrun --nproc_per_node=4 train.py experiment=paper_1b activation=xielu",
    ):
        assert command in text


def test_a_loss_near_the_entropy_says_to_train_longer(tiny, tmp_path):
    model, tokenizer, config = tiny
    batches = [batch([0, 1, 2, 3])]
    (line, *_) = run_summary(model, tokenizer, batches, tmp_path, config, val_loss=1.3)
    assert "train longer" in line
    (line, *_) = run_summary(model, tokenizer, batches, tmp_path, config)  # nothing logged
    assert line.startswith("validation loss: none logged")


def test_none_logged_says_why_from_the_run_s_settings(tiny, tmp_path):
    """The hint named validation.every=0 whatever the reason; and a logged loss whose slice
    this process never read (a resume) came out as none logged."""
    model, tokenizer, config = tiny
    batches = [batch([0, 1, 2, 3])]

    def first_line(config, val_loss=None, batches=batches):
        return run_summary(model, tokenizer, batches, tmp_path, config, val_loss=val_loss)[0]

    held_none = replace(config, data=replace(config.data, validation_documents=0))
    assert "none logged (data.validation_documents=0" in first_line(held_none)
    never = replace(config, validation=replace(config.validation, every=0))
    assert "none logged (validation.every=0" in first_line(never)
    assert "validation.every=0" not in first_line(config)
    line = first_line(config, val_loss=1.3, batches=None)
    assert line.startswith("validation loss 1.300 nats/token") and "none logged" not in line


def test_an_activation_transformers_lacks_gets_no_export_command(tmp_path):
    config, _ = compose([f"trainer.run_dir={tmp_path}", "activation=xiprelu"])
    tokenizer = load_tokenizer(TokenizerConfig("bytes"))
    model = Llama(ModelConfig(vocab_size=384, dim=32, n_layers=1, n_heads=2, activation="xiprelu"))
    lines = run_summary(model, tokenizer, [batch([1, 2])], tmp_path, config, max_new_tokens=2)
    assert not any("export_hf" in line for line in lines)
    assert any("xiprelu has no transformers class" in line for line in lines)


def test_a_failing_sample_does_not_fail_the_finished_run(tiny, tmp_path):
    model, _, config = tiny

    class Broken:
        name, vocab_size, bos_id, eos_id = "broken", 384, None, 257

        def encode(self, text):
            raise RuntimeError("no vocabulary file")

    lines = run_summary(model, Broken(), [batch([1, 2])], tmp_path, config, val_loss=0.5)
    assert lines[1] == "sample: not drawn (RuntimeError: no vocabulary file)"


def test_the_closing_line_says_what_the_validation_loss_covers(tiny, tmp_path):
    """The quickstart's closing 2.142 covered 4 batches (8k tokens) while eval.perplexity's
    1.980 covered the whole slice, and nothing said so."""
    from dataclasses import replace

    model, tokenizer, config = tiny
    record = {"step": 100, "val/loss": 1.5, "val/tokens": 8192}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    batches = [batch([1, 2, 3])]
    part = replace(config, validation=replace(config.validation, batches=4))
    (line, *_) = run_summary(model, tokenizer, batches, tmp_path, part, max_new_tokens=2)
    assert "Over 8,192 held-out tokens, the first validation.batches=4 batches" in line
    assert f"python -m eval.perplexity {tmp_path} scores the whole slice" in line
    whole = replace(config, validation=replace(config.validation, batches=0))
    (line, *_) = run_summary(model, tokenizer, batches, tmp_path, whole, max_new_tokens=2)
    assert line.endswith("Over the whole held-out slice (8,192 tokens).")


@pytest.mark.parametrize(
    "loss, words",
    [
        (1.0, "predicts from context"),  # below 80% of the entropy
        (1.9, "little below what token frequencies"),
        (2.0, "above what token frequencies"),  # equal: not below
        (11.787, "above what token frequencies"),  # a reported 11.787 against 4.355, scaled
    ],
)
def test_the_verdict_follows_the_sign_of_the_difference_with_the_entropy(loss, words):
    from training.summary import loss_line

    line = loss_line(loss, 2.0 if loss < 11 else 4.355, "mistral_nemo")
    assert words in line
