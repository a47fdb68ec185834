"""eval.perplexity reloads a run's checkpoint and reproduces the trainer's validation loss."""

import json
import math

import pytest

from data_fixtures import write_parquet_corpus
from eval.perplexity import main as perplexity
from train_helpers import metrics, run_in_process, tiny_overrides
from training.runs import load_trained_model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    write_parquet_corpus(corpus, files=2, row_group_size=30)
    run_dir = tmp_path_factory.mktemp("run")
    assert run_in_process(tiny_overrides(corpus, run_dir, **{"trainer.steps": 6})) == 0
    return run_dir


def test_perplexity_of_the_final_checkpoint_equals_the_trainers_validation(trained):
    (val,) = [m["val/loss"] for m in metrics(trained) if m["step"] == 6 and "val/loss" in m]
    result = perplexity([str(trained), "--batches", "2", "--batch-size", "2"])
    assert result["step"] == 6
    assert result["loss"] == pytest.approx(val, rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(val), rel=1e-6)
    assert result["tokens"] == 2 * 2 * 32


def test_the_whole_slice_and_an_older_checkpoint(trained):
    whole = perplexity([str(trained), "--step", "4"])
    assert whole["step"] == 4 and whole["tokens"] > 128
    model, config, step = load_trained_model(trained, 4)
    assert step == 4 and config.model.dim == 32 and not model.training
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 5"):
        load_trained_model(trained, 5)


def test_a_run_exports_to_transformers_with_its_tokenizer_ids(trained, tmp_path):
    from data import load_tokenizer
    from scripts.export_hf import main as export
    from training.runs import run_config

    export([str(tmp_path), "--run-dir", str(trained), "--check"])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["ArceeForCausalLM"]
    tokenizer = load_tokenizer(run_config(trained).data.tokenizer)  # the run's own: bytes
    ids = (config["bos_token_id"], config["eos_token_id"])
    assert ids == (tokenizer.bos_id, tokenizer.eos_id) == (256, 257)


def test_a_run_config_written_before_key_renames_still_loads(tmp_path):
    from omegaconf import OmegaConf

    from training.config import ExperimentConfig
    from training.runs import run_config

    old = OmegaConf.to_container(OmegaConf.structured(ExperimentConfig))
    old["data"]["document_ids"] = old["data"].pop("document_mask")
    old["data"]["document_ids"] = True
    old["trainer"]["compile"], old["trainer"]["activation_checkpointing"] = True, False
    old["trainer"]["run_dir"] = str(tmp_path)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(old))
    config = run_config(tmp_path)
    assert config.data.document_mask is True
    assert (config.trainer.compile, config.trainer.activation_checkpointing) == ("blocks", "none")


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
