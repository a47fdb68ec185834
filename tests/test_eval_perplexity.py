"""eval.perplexity reloads a run's checkpoint and reproduces the trainer's validation loss."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from data import load_tokenizer
from data_fixtures import real_documents, write_parquet_corpus
from eval.perplexity import main as perplexity
from model import Llama
from train_helpers import metrics, run_in_process, tiny_overrides
from training.checkpoint import load_trained_model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    write_parquet_corpus(corpus, files=2, row_group_size=30)
    run_dir = tmp_path_factory.mktemp("run")
    assert run_in_process(tiny_overrides(corpus, run_dir, **{"trainer.steps": 6})) == 0
    return run_dir


def direct_cross_entropy(run_dir, step: int, windows: int | None = None) -> tuple[float, int]:
    """(mean loss, targets) of the checkpoint's model over the first ``windows`` windows of the
    held-out slice (None: all), computed here without the data pipeline or the validation loop.

    The slice is the corpus's first ``validation_documents`` documents, each followed by EOS,
    concatenated; window k predicts tokens kL+1 .. kL+L from the L before them. The model runs
    in float64 on each window at its true length (the last one is short, not padded), and one
    cross-entropy is taken over every target of every window: weighted by token, not batch.
    """
    model, config, _ = load_trained_model(run_dir, step)
    data = config.data
    assert not data.document_mask and not data.tokenizer.add_bos  # what the stream below assumes
    tokenizer = load_tokenizer(data.tokenizer)
    held = real_documents()[: data.validation_documents]  # the corpus, in file order
    stream = torch.tensor([t for text in held for t in [*tokenizer.encode(text), tokenizer.eos_id]])
    starts = range(0, len(stream) - 1, data.seq_len)[:windows]
    model = model.double()
    logits, targets = [], []
    with torch.no_grad():
        for start in starts:
            window = stream[start : start + data.seq_len + 1]
            logits.append(model(window[None, :-1])[0])
            targets.append(window[1:])
    loss = F.cross_entropy(torch.cat(logits), torch.cat(targets), ignore_index=-100)
    return float(loss), sum(len(t) for t in targets)


def test_perplexity_of_the_final_checkpoint_equals_the_trainers_validation(trained):
    """Two truths: the trainer's logged ``val/loss`` (the same loop, so it only shows the
    checkpoint and batches are the trainer's) and a cross-entropy computed here directly."""
    (val,) = [m["val/loss"] for m in metrics(trained) if m["step"] == 6 and "val/loss" in m]
    result = perplexity([str(trained), "--batches", "2", "--batch-size", "2"])
    assert result["step"] == 6
    assert result["loss"] == pytest.approx(val, rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(val), rel=1e-6)
    assert result["tokens"] == 2 * 2 * 32
    loss, tokens = direct_cross_entropy(trained, 6, windows=2 * 2)
    assert (result["loss"], result["tokens"]) == (pytest.approx(loss, rel=1e-6), tokens)


def test_the_whole_slice_is_the_token_weighted_loss_over_every_held_out_token(trained):
    """Batches of 4 windows: the last batch is short and its last window partly ignored, so a
    mean of per-batch means, or a token counted twice or dropped, would show."""
    whole = perplexity([str(trained), "--step", "4", "--batch-size", "4"])
    loss, tokens = direct_cross_entropy(trained, 4)
    assert whole["step"] == 4 and tokens % (4 * 32) != 0
    assert (whole["loss"], whole["tokens"]) == (pytest.approx(loss, rel=1e-6), tokens)


def test_an_older_checkpoint_loads_and_a_missing_one_is_refused(trained):
    model, config, step = load_trained_model(trained, 4)
    assert step == 4 and config.model.dim == 32 and not model.training
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 5"):
        load_trained_model(trained, 5)


@pytest.mark.slow
def test_a_run_exports_to_transformers_with_its_tokenizer_ids(trained, tmp_path):
    from data import load_tokenizer
    from scripts.export_hf import main as export
    from training.checkpoint import run_config

    export([str(tmp_path), "--run-dir", str(trained), "--check"])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["ArceeForCausalLM"]
    tokenizer = load_tokenizer(run_config(trained).data.tokenizer)  # the run's own: bytes
    ids = (config["bos_token_id"], config["eos_token_id"])
    assert ids == (tokenizer.bos_id, tokenizer.eos_id) == (256, 257)


def test_a_run_config_written_before_key_renames_and_removals_still_loads(tmp_path):
    from omegaconf import OmegaConf

    from training.checkpoint import run_config
    from training.config import ExperimentConfig

    old = OmegaConf.to_container(OmegaConf.structured(ExperimentConfig))
    old["data"]["document_ids"] = old["data"].pop("document_mask")
    old["data"]["document_ids"] = True
    old["trainer"]["compile"], old["trainer"]["activation_checkpointing"] = True, False
    # the fault injection left the schema for tests/faults.py
    old["trainer"].update(debug_nan_steps=[2], debug_crash_in_checkpoint_at=-1, debug_signal="")
    old["trainer"]["run_dir"] = str(tmp_path)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(old))
    config = run_config(tmp_path)
    assert config.data.document_mask is True
    assert (config.parallel.compile, config.parallel.activation_checkpointing) == ("blocks", "none")


def test_the_device_flag_reaches_the_model(trained, monkeypatch):
    import torch

    import eval.perplexity as module

    devices = []

    def spy(run_dir, step=None, device="cpu"):
        devices.append(torch.device(device))
        return load_trained_model(run_dir, step, device)

    monkeypatch.setattr(module, "load_trained_model", spy)
    result = perplexity([str(trained), "--batches", "1", "--batch-size", "2", "--device", "cpu"])
    assert devices == [torch.device("cpu")] and result["tokens"] == 2 * 32
    perplexity([str(trained), "--batches", "1", "--batch-size", "2"])
    assert devices[-1].type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.slow
def test_the_export_check_reads_the_runs_text_and_tells_rounding_from_arithmetic(trained, tmp_path):
    """transformers' Arcee keeps xIELU's scalars in bf16: on the run's own text that rounding,
    not the arithmetic, is what the logits differ by (2.0e-3 on real text against
    2.2e-6 on random tokens before the check said which)."""
    from model.hf import export_hf
    from scripts.export_hf import check, validation_tokens

    model, config, _ = load_trained_model(trained)
    export_hf(model, tmp_path)
    text = validation_tokens(config, model.config.max_seq_len)
    assert text is not None and text.shape == (2, 32)
    rows = check(model, tmp_path, text)
    assert [r["input"] for r in rows] == ["validation text (2 x 32)", "random tokens (2 x 32)"]
    assert {r["class"] for r in rows} == {"ArceeForCausalLM"}
    # the independent truth: our model with its activation scalars rounded to bf16 by hand
    rounded = Llama(model.config)
    rounded.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, tensor in [*rounded.named_parameters(), *rounded.named_buffers()]:
            if ".mlp." in name and tensor.numel() == 1:  # alpha_p, alpha_n, beta, eps
                tensor.copy_(tensor.bfloat16().float())
        gap = float((rounded.eval()(text) - model.float().eval()(text)).abs().max())
    assert gap > 0 and all(row["arithmetic"] < 1e-5 for row in rows)
    assert rows[0]["difference"] == pytest.approx(gap, abs=1e-5)
