"""A run that starts from published weights (``checkpoint.initial_hf``): a transformers Llama, an
Apertus and this project's own export, each built by transformers or the exporter, never by the
code under test. The first step's loss is the transformers model's own loss on that step's
batch; 2 ranks (FSDP2, DDP) follow 1 process; a stop resumes from the run's own checkpoint; a
checkpoint that cannot start the run is refused before anything is written."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from faults import faults_env
from hf_fixtures import LAYERS, apertus_checkpoint, llama_checkpoint, own_export
from settings import ConfigError
from train_helpers import compose, losses, run, run_in_process, tiny_overrides

transformers = pytest.importorskip("transformers")

# the byte tokenizer saved beside the transformers checkpoints; this project's export ships none
KINDS = {
    "llama": (llama_checkpoint, "hf"),
    "apertus": (apertus_checkpoint, "hf"),
    "own_export": (own_export, "bytes"),
}


def start_overrides(corpus, run_dir, checkpoint, tokenizer="hf", **extra) -> list[str]:
    """The tests' tiny run with its model taken from ``checkpoint`` (the quickstart's 2 layers
    are the fixtures' too, so the experiment's one model key agrees with them)."""
    assert LAYERS == 2
    values = [o for o in tiny_overrides(corpus, run_dir, **extra) if not o.startswith("model.")]
    return [
        *values,
        "model=from_checkpoint",
        "activation=from_checkpoint",
        f"checkpoint.initial_hf={checkpoint}",
        f"data.tokenizer.name={tokenizer}",
    ]


def transformers_loss(checkpoint, config) -> float:
    """The mean loss over the first step's micro-batches, by transformers' own model holding
    the checkpoint's exact values (Arcee builds xIELU's scalars in bf16: put the file's back)."""
    from safetensors.torch import load_file

    from data import build_loader

    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    hf = hf.float().eval()
    exact = {k: v for f in checkpoint.glob("*.safetensors") for k, v in load_file(f).items()}
    hf.load_state_dict({k: v for k, v in exact.items() if ".act_fn." in k}, strict=False)
    t = config.trainer
    batches = iter(build_loader(config.data, t.micro_batch, 0, 1))
    total = 0.0
    with torch.no_grad():
        for _ in range(t.global_batch // t.micro_batch):
            batch = next(batches)
            logits = hf(batch["inputs"]).logits
            targets = batch["targets"].flatten()
            cross_entropy = torch.nn.functional.cross_entropy
            total += float(cross_entropy(logits.flatten(0, 1), targets, ignore_index=-100))
    return total / (t.global_batch // t.micro_batch)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_first_step_loss_is_the_transformers_models_on_that_batch(corpus, tmp_path, kind):
    make, tokenizer = KINDS[kind]
    checkpoint = make()
    overrides = start_overrides(
        corpus, tmp_path / "run", checkpoint, tokenizer, **{"trainer.steps": 6}
    )
    config, _ = compose(overrides)
    expected = transformers_loss(checkpoint, config)
    assert run_in_process(overrides) == 0
    first = losses(tmp_path / "run")[1]
    print(f"{kind}: first step {first:.7f}, transformers {expected:.7f}")
    assert first == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_the_model_and_tokenizer_are_the_checkpoints(corpus, tmp_path):
    from data import load_tokenizer
    from model.hf import checkpoint_config

    checkpoint = apertus_checkpoint()
    config, saved = compose(start_overrides(corpus, tmp_path / "run", checkpoint))
    theirs = checkpoint_config(checkpoint)
    assert config.model.qk_norm and config.model.rope_scaling == "llama3"
    for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "activation", "vocab_size"):
        assert getattr(config.model, key) == getattr(theirs, key)
    assert config.data.tokenizer.path == str(checkpoint)
    assert load_tokenizer(config.data.tokenizer).vocab_size == 257
    assert "${initial_hf:" not in saved  # the run directory's config holds the values


@pytest.mark.slow
def test_two_fsdp2_ranks_start_as_one_process_and_a_stop_resumes_from_the_runs_own_checkpoint(
    corpus, tmp_path
):
    """Stopped on 2 FSDP2 ranks at step 6 and resumed on 1, the run follows 1 process's (2 ranks
    of 1 data worker read the streams of 1 process with 2); the resume reads its own
    checkpoint, not the published weights, and says so."""
    checkpoint = apertus_checkpoint()
    one, two = {"data.num_workers": 2}, {"data.num_workers": 1}
    fsdp = {"parallel.strategy": "fsdp"}
    single_dir, run_dir = tmp_path / "single", tmp_path / "two"
    assert run_in_process(start_overrides(corpus, single_dir, checkpoint, **one)) == 0
    single = losses(single_dir)
    stop = faults_env(signal="SIGTERM@6")
    code, output = run(start_overrides(corpus, run_dir, checkpoint, **fsdp, **two), 2, env=stop)
    assert code == 75 and "initial weights:" in output, output[-3000:]
    code, output = run(start_overrides(corpus, run_dir, checkpoint, **one))
    assert code == 0 and "not read: the run resumes from its own checkpoint" in output, output[
        -3000:
    ]
    resumed = losses(run_dir)
    assert resumed.keys() == single.keys()
    assert max(abs(resumed[s] - single[s]) / single[s] for s in single) < 1e-5


@pytest.mark.slow
def test_two_ddp_ranks_start_as_one_process(corpus, tmp_path):
    checkpoint = llama_checkpoint()
    steps = {"trainer.steps": 6}
    single_dir, run_dir = tmp_path / "single", tmp_path / "two"
    one = start_overrides(corpus, single_dir, checkpoint, **{"data.num_workers": 2}, **steps)
    assert run_in_process(one) == 0
    two = start_overrides(corpus, run_dir, checkpoint, **{"data.num_workers": 1}, **steps)
    code, output = run(two, ranks=2)
    assert code == 0, output[-3000:]
    single, both = losses(single_dir), losses(run_dir)
    assert max(abs(both[s] - single[s]) / single[s] for s in single) < 1e-5


def refused(overrides, run_dir, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        run_in_process(overrides)
    assert not run_dir.exists()


def test_settings_that_disagree_with_the_checkpoint_are_refused_naming_both_values(
    corpus, tmp_path
):
    checkpoint, run_dir = llama_checkpoint(), tmp_path / "run"
    overrides = [*start_overrides(corpus, run_dir, checkpoint), "model.dim=64", "activation=xielu"]
    refused(
        overrides,
        run_dir,
        r"model\.dim=64 \(the checkpoint's: 32\); "
        r"model\.activation=xielu \(the checkpoint's: swiglu\)",
    )


def test_a_directory_that_is_not_a_checkpoint_is_refused(corpus, tmp_path):
    empty, run_dir = tmp_path / "empty", tmp_path / "run"
    empty.mkdir()
    refused(start_overrides(corpus, run_dir, empty), run_dir, "no config.json")
    shutil.copy(llama_checkpoint() / "config.json", empty)
    refused(start_overrides(corpus, run_dir, empty), run_dir, r"no \*\.safetensors")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model_type": "mistral"}, "cannot import model_type 'mistral'"),
        ({"hidden_act": "mish"}, "hidden_act 'mish' of a llama model has no project activation"),
    ],
)
def test_an_architecture_or_activation_the_model_cannot_hold_is_refused(
    corpus, tmp_path, change, match
):
    other, run_dir = tmp_path / "other", tmp_path / "run"
    shutil.copytree(llama_checkpoint(), other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, **change}))
    refused(start_overrides(corpus, run_dir, other), run_dir, match)


def test_a_tokenizer_other_than_the_checkpoints_is_refused_when_its_vocabulary_differs(
    corpus, tmp_path
):
    run_dir = tmp_path / "run"
    overrides = start_overrides(corpus, run_dir, llama_checkpoint(), tokenizer="bytes")
    refused(
        overrides,
        run_dir,
        r"its own tokenizer \(257 ids\), and data.tokenizer reads the text into 258",
    )


def test_a_tokenizer_larger_than_the_checkpoints_vocabulary_is_refused(corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = start_overrides(corpus, run_dir, own_export(), tokenizer="llama3")
    refused(overrides, run_dir, r"model\.vocab_size=384 is smaller than the tokenizer's")


def test_model_from_checkpoint_without_a_checkpoint_is_refused():
    with pytest.raises(ConfigError, match="which is not set"):
        compose(["model=from_checkpoint", "activation=from_checkpoint"])


def test_a_saved_run_config_reads_without_the_checkpoint(corpus, tmp_path):
    """The run directory's config.yaml holds the architecture itself: evaluation and resume
    checks read it with the published checkpoint gone."""
    from training.checkpoint.runs import config_from_file

    moved = tmp_path / "moved"
    shutil.copytree(llama_checkpoint(), moved)
    config, saved = compose(start_overrides(corpus, tmp_path / "run", moved))
    (tmp_path / "config.yaml").write_text(saved)
    shutil.rmtree(moved)
    assert config_from_file(tmp_path / "config.yaml").model == config.model


def test_the_documented_apertus_command_composes_and_a_llama_under_apertus_recipe_does_not():
    """docs/huggingface.md's continued pretraining: the recipe's model keys (QK-norm, untied
    head, llama3 RoPE x 8) agree with an Apertus checkpoint, and are refused for a Llama."""
    command = ["experiment=continued", "recipe=apertus", "data.paths=[/x/*.parquet]"]
    config, _ = compose([*command, f"checkpoint.initial_hf={apertus_checkpoint()}"])
    assert config.model.activation == "xielu" and config.optim.name == "ademamix"
    assert config.parallel.strategy == "fsdp" and config.data.tokenizer.name == "hf"
    with pytest.raises(ConfigError, match=r"model\.qk_norm=True \(the checkpoint's: False\)"):
        compose([*command, f"checkpoint.initial_hf={llama_checkpoint()}"])


def test_a_sharded_checkpoint_reads_the_files_its_index_names_and_no_tensor_twice(tmp_path):
    from model.hf import import_hf

    sharded = tmp_path / "sharded"
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama_checkpoint())
    hf.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    whole = import_hf(llama_checkpoint()).state_dict()
    # a file the index does not name (a stale sharding) is not read
    shutil.copy(llama_checkpoint() / "model.safetensors", sharded / "model-stale.safetensors")
    read = import_hf(sharded).state_dict()
    assert read.keys() == whole.keys() and all(torch.equal(read[k], whole[k]) for k in whole)
    (sharded / "model.safetensors.index.json").unlink()  # without it every file is read
    with pytest.raises(ValueError, match="is stored in both"):
        import_hf(sharded)


def test_settings_that_build_the_checkpoints_model_or_only_lengthen_its_context_are_taken(
    corpus, tmp_path
):
    """``n_kv_heads`` written out as ``n_heads`` is the checkpoint's None; the RoPE tables'
    length is the run's to choose (a longer context than the checkpoint's)."""
    overrides = start_overrides(corpus, tmp_path / "run", own_export(), "bytes")
    config, _ = compose([*overrides, "model.n_kv_heads=2", "model.max_seq_len=256"])
    assert config.model.kv_heads == 2 and config.model.max_seq_len == 256
