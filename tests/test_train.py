"""train.py end to end on CPU: configs, loss, resume, preemption, crashes, NaNs, logging."""

import json
import logging
import math
import re
import signal

import pytest
from hydra.errors import ConfigCompositionException

from faults import fault_components, faults_env
from train_helpers import (
    compose,
    losses,
    metrics,
    run,
    run_in_process,
    run_launched,
    tiny_overrides,
)
from wandb_records import history_keys, run_settings


@pytest.mark.slow
def test_invalid_configs_stop_before_any_work_naming_the_key(corpus, tmp_path):
    base = tiny_overrides(corpus, tmp_path / "run")
    with pytest.raises(ValueError, match=r"unknown configuration keys: trainer\.stepz"):
        compose([*base, "+trainer.stepz=3"])
    with pytest.raises(ConfigCompositionException, match="stepz"):
        compose([*base, "trainer.stepz=3"])
    with pytest.raises(ConfigCompositionException, match=r"trainer\.steps=many"):
        compose([*base, "trainer.steps=many"])
    with pytest.raises(ValueError, match=r"model\.dim=30 is not divisible by model\.n_heads=4"):
        compose([*base, "model.dim=30", "model.n_heads=4"])
    for override, message in [
        ("trainer.global_batch=5", r"trainer\.global_batch=5 is not divisible"),
        ("schedule.warmup_steps=10", r"schedule\.warmup_steps=10 \+ schedule\.decay_steps=4"),
        ("data.seq_len=64", r"data\.seq_len=64 exceeds model\.max_seq_len=32"),
        ("parallel.strategy=zero3", r"parallel\.strategy='zero3' is not one of"),
        ("trainer.global_batch_tokens=100", r"trainer\.global_batch_tokens=100 is not a"),
        # 0 passed validation and then stopped the run after its first (healthy) step
        ("spikes.max_bad_steps=0", r"spikes\.max_bad_steps must be positive, got 0"),
        # a negative clip climbed the gradient, lr 0 trained nothing, a zero MLP
        # width divided by zero, a small vocabulary indexed past the embedding at step 1
        ("optim.grad_clip=-1", r"optim\.grad_clip must be >= 0 .* got -1"),
        ("optim.lr=0", r"optim\.lr must be positive \(0 trains nothing\), got 0"),
        ("model.mlp_hidden=0", r"model\.mlp_hidden must be positive, got 0"),
        ("model.vocab_size=100", r"model\.vocab_size=100 is smaller than the tokenizer's .*258"),
        ("data.text_column=body", r"no column 'body' \(data\.text_column\); its columns: "),
    ]:
        with pytest.raises(ValueError, match=message):
            run_in_process([*base, override])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_every_activation_and_experiment_composes(corpus, tmp_path):
    from xielu import available_activations

    for name in available_activations():
        config, _ = compose([f"activation={name}"])
        assert config.model.activation == name
    for experiment, (steps, batch, seq, lr) in {
        "paper_1b": (70000, 440, 4096, 8e-4),
        "paper_3b": (50000, 640, 4096, 7e-4),
        "ablation_1b": (50000, 80, 1024, 6e-4),
    }.items():
        config, _ = compose([f"experiment={experiment}", "data.paths=[/x/*.parquet]"])
        t = config.trainer
        assert (t.steps, t.global_batch, config.data.seq_len, config.optim.lr) == (
            steps,
            batch,
            seq,
            lr,
        )
    config, _ = compose(["experiment=ablation_1b", "data.paths=[/x/*.parquet]"])
    assert config.schedule.name == "cosine" and config.optim.min_lr == 6e-5
    assert config.data.tokenizer.name == "llama3" and config.optim.weight_decay == 0.01


def test_training_loss_falls_and_metrics_are_written(reference):
    run_dir, loss = reference
    assert sorted(loss) == list(range(1, 13))
    assert sum(list(loss.values())[-3:]) / 3 < sum(list(loss.values())[:3]) / 3 - 0.3
    records = metrics(run_dir)
    last = [m for m in records if "loss" in m][-1]
    for key in (
        "lr",
        "grad_norm",
        "tokens",
        "tokens_per_s",
        "perplexity",
        "memory_gib",
        "alpha_p/layer_00",
        "alpha_n/layer_01",
    ):
        assert key in last, key
    assert last["tokens"] == 12 * 4 * 32 and "mfu" not in last  # no peak known for a CPU
    assert any("val/loss" in m for m in records)
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_000008", "step_000012"]  # keep_checkpoints=2


@pytest.mark.slow
def test_resume_after_sigkill_reproduces_every_loss(corpus, reference, tmp_path):
    _, expected = reference
    overrides = tiny_overrides(corpus, tmp_path)
    code, output = run(overrides, env=faults_env(signal="SIGKILL@6"))  # between checkpoints
    assert code == -signal.SIGKILL, output
    assert max(losses(tmp_path)) == 5  # killed once step 6 is taken, before it is logged
    code, output = run(overrides)
    assert code == 0, output
    assert "resumed from" in output and "step_000004" in output
    assert losses(tmp_path) == expected


@pytest.mark.slow
def test_crash_while_saving_leaves_the_previous_checkpoint(corpus, reference, tmp_path):
    _, expected = reference
    overrides = tiny_overrides(corpus, tmp_path)
    code, output = run(overrides, env=faults_env(crash_in_checkpoint_at=8))
    assert code == 13, output
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000004", "step_000008.tmp"]
    code, output = run(overrides)
    assert code == 0 and "step_000004 at step 4" in output, output
    assert losses(tmp_path) == expected


@pytest.mark.slow
def test_a_crashed_saves_tmp_directory_is_removed_when_the_run_starts_again(corpus, tmp_path):
    """A .tmp whose step is not saved again (here: the rerun ends at step 6) held a whole
    checkpoint's disk for ever."""
    overrides = tiny_overrides(corpus, tmp_path)
    code, output = run(overrides, env=faults_env(crash_in_checkpoint_at=8))
    assert code == 13, output
    code, output = run([*overrides, "trainer.steps=6", "schedule.decay_steps=2"])
    assert code == 0 and "removed" in output and "step_000008.tmp" in output, output
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000004",
        "step_000006",
    ]


@pytest.mark.slow
@pytest.mark.mutation
def test_non_finite_steps_are_skipped_then_stop_the_run(corpus, tmp_path, caplog):
    one = tmp_path / "one"
    overrides = tiny_overrides(corpus, one, **{"trainer.steps": 6})
    # two bad steps, never two in a row
    assert run_in_process(overrides, fault_components(nan_steps=[1, 3])) == 0
    records = [m for m in metrics(one) if "loss" in m]
    assert math.isnan(records[3]["loss"]) and records[-1]["skipped_steps"] == 2
    assert math.isfinite(records[-1]["loss"])
    # the warning names the step's own loss and gradient norm
    assert "step 2: non-finite loss nan or gradient norm nan; update skipped" in caplog.text
    many = tmp_path / "many"
    code = run_in_process(
        tiny_overrides(
            corpus,
            many,
            **{"spikes.max_bad_steps": 2, "checkpoint.every": 2},
        ),
        fault_components(nan_steps=[2, 3, 4]),
    )
    assert code == 3
    assert "2 consecutive steps had a non-finite loss" in caplog.text  # max_bad_steps=2: at 4
    # steps 3 and 4 non-finite, two in a row: the run stops at step 4, before its checkpoint;
    # step 2's is the last good state
    names = [p.name for p in (many / "checkpoints").iterdir()]
    assert names == ["step_000002"]


@pytest.mark.slow
@pytest.mark.mutation
def test_wandb_offline_run_receives_the_scalars_and_alpha_table(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = tiny_overrides(
        corpus, tmp_path, **{"logging.wandb.mode": "offline", "trainer.steps": 6}
    )
    assert run_in_process(overrides) == 0
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    keys = history_keys(run_file)  # wandb.finish() returned: the service has written it
    for key in (
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "val/loss",
        "val/perplexity",
        "alpha_p/layer_00",
        "alpha_n/layer_01",
        "alpha_by_depth/table/_type",
    ):
        assert key in keys, key
    jsonl_keys = set().union(*(m.keys() for m in metrics(tmp_path)))
    assert {"loss", "val/loss", "alpha_p/layer_00", "alpha_n/layer_01"} <= jsonl_keys
    # the run is named after the experiment and holds the model as built: its vocabulary the
    # tokenizer's 258 (256 bytes and two specials) padded to model.vocab_multiple, not None
    name, config = run_settings(run_file)
    composed = compose(overrides)[0]
    assert name == composed.name and composed.model.vocab_size is None
    multiple = composed.model.vocab_multiple
    assert config["model"]["vocab_size"] == -(-258 // multiple) * multiple
    assert config["trainer"]["steps"] == 6


@pytest.mark.slow
@pytest.mark.mutation
def test_batch_in_tokens_and_activation_checkpointing_train_the_same(corpus, reference, tmp_path):
    _, expected = reference
    overrides = tiny_overrides(
        corpus,
        tmp_path,
        **{
            "trainer.global_batch": 999,
            "trainer.global_batch_tokens": 4 * 32,
            "parallel.activation_checkpointing": "full",
        },
    )
    assert run_in_process(overrides) == 0
    got = losses(tmp_path)
    assert got.keys() == expected.keys()
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=1e-6), step


@pytest.mark.slow
@pytest.mark.mutation
def test_the_loop_runs_each_hook_where_it_belongs(corpus, tmp_path, capsys, caplog):
    """The loop's wiring, read from what a run leaves: the per-layer gradient norms are taken
    before clipping (a clip at 1e-3 leaves them as large as the unclipped total says) and logged
    at their own step; the loss mask's dropped fraction is logged at every step; the run
    directory is made with its parents and named by the opening line; the per-layer
    measurements stay off the console, where each line says more than its step."""
    run_dir = tmp_path / "runs" / "nested" / "run"
    extra = {
        "trainer.steps": 4,
        "schedule.warmup_steps": 1,
        "schedule.decay_steps": 2,
        "validation.every": 2,
        "logging.grad_norms_every": 2,
        "logging.outliers_every": 2,
        "optim.grad_clip": 1e-3,
        "loss.goldfish_k": 4,
        "loss.goldfish_h": 2,
    }
    with caplog.at_level(logging.INFO, logger="training.loop"):
        assert run_in_process(tiny_overrides(corpus, run_dir, **extra)) == 0
    records = metrics(run_dir)
    steps = {m["step"]: m for m in records if "loss" in m}
    assert sorted(steps) == [1, 2, 3, 4]
    norms = [m for m in records if "grad_norm/mlp/layer_00" in m]
    assert [m["step"] for m in norms] == [2, 4]
    for m in norms:
        total = steps[m["step"]]["grad_norm"]  # the unclipped norm of every gradient
        blocks = sum(v * v for k, v in m.items() if k.startswith("grad_norm/"))
        assert 1e-3 < math.sqrt(blocks) <= total * (1 + 1e-6)
    # Goldfish at k=4 leaves out about a quarter of the 128 targets of each step (the first
    # h - 1 targets of a window never: training/loss_mask.py)
    for m in steps.values():
        assert 0.1 < m["loss_mask/dropped"] < 0.4
    assert any(str(run_dir) in r.getMessage() for r in caplog.records)
    lines = re.findall(r"^step +\d+.*$", capsys.readouterr().out, flags=re.MULTILINE)
    assert len(lines) == 4 + 2  # the steps, the two validations
    assert all(" | " in line for line in lines), lines
    assert sum(" | val " in line for line in lines) == 2


@pytest.mark.slow
@pytest.mark.mutation
def test_in_loop_downstream_calls_the_evaluator_given_at_its_cadence(corpus, tmp_path):
    """``train(..., downstream=evaluator)``: the evaluator gets the model being trained and the
    run's task settings at every ``downstream.every`` steps (lm-eval's own scores:
    tests/test_downstream_in_training.py)."""
    from model import Llama
    from training.loop import train

    calls = []

    def evaluator(model, tokenizer, tasks, limit, data, include, env, add_bos, micro_batch):
        calls.append((type(model), list(tasks), limit, data, include, micro_batch))
        return {"downstream/fake/acc": float(len(calls))}

    data = tmp_path / "benchmarks"  # read by the evaluator alone: must only exist
    data.mkdir()
    run_dir = tmp_path / "run"
    settings = {
        "downstream.every": 6,
        "downstream.tasks": "[piqa]",
        "downstream.limit": 3,
        "downstream.data": str(data),
    }
    config, config_yaml = compose(tiny_overrides(corpus, run_dir, **settings))
    assert train(config, config_yaml, downstream=evaluator) == 0
    include = run_dir / "downstream_tasks"
    assert calls == [(Llama, ["piqa"], 3, str(data), include, 2)] * 2
    scored = [m for m in metrics(run_dir) if "downstream/seconds" in m]
    assert [(m["step"], m["downstream/fake/acc"]) for m in scored] == [(6, 1.0), (12, 2.0)]


def test_in_loop_downstream_without_an_evaluator_is_refused_before_any_work(corpus, tmp_path):
    from training.errors import ConfigError
    from training.loop import Trainer

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(corpus, run_dir, **{"downstream.every": 6})
    with pytest.raises(ConfigError, match=r"downstream\.every=6 needs a downstream"):
        Trainer(*compose(overrides))
    assert not run_dir.exists()


@pytest.mark.slow
@pytest.mark.e2e
def test_python_train_py_with_the_quickstart_defaults_learns(tmp_path):
    """README's main job as it is (bytes, builtin corpus, offline wandb, the activation's
    kernel the CPU gets: compiled by Inductor where a C++ compiler is), to its closing lines."""
    code, output = run_launched([f"trainer.run_dir={tmp_path}"], timeout=600, as_shipped=True)
    assert code == 0, output[-3000:]
    assert "falling back to the eager kernel" not in output  # xielu/fused/ops.py
    loss = losses(tmp_path)
    assert loss[10] < math.log(258) and loss[480] < loss[10] - 1.0  # ln 258: uniform bytes
    assert (tmp_path / "checkpoints" / "step_000480").is_dir()
    assert list(tmp_path.glob("wandb/offline-run-*"))
    verdict = next(line for line in output.splitlines() if line.startswith("validation loss"))
    val_loss, entropy = (float(x) for x in re.findall(r"(\d+\.\d+) (?:nats|for)", verdict))
    assert val_loss == pytest.approx(metrics(tmp_path)[-1]["val/loss"], abs=1e-3)
    assert val_loss < 0.8 * entropy and "predicts from context" in verdict
    assert re.search(r'^sample \(temperature .*\): "If the', output, re.MULTILINE)
    for command in (
        "scripts.plot_curves",
        "eval.perplexity",
        "eval.generate",
        "experiment=paper_1b",
    ):
        assert command in output


def test_a_jsonl_corpus_whose_first_record_lacks_the_text_column_is_refused_by_name(tmp_path):
    """It ended in a ZeroDivisionError in the diagnostics (with them off: "no
    training document... (counters: {})"); a parquet file's schema already said so."""
    from data_fixtures import real_documents

    (tmp_path / "corpus").mkdir()
    lines = [json.dumps({"body": d}) for d in real_documents()[:20]]
    (tmp_path / "corpus" / "docs.jsonl").write_text("\n".join(lines) + "\n")
    overrides = tiny_overrides(tmp_path / "corpus", tmp_path / "run")
    overrides = [o for o in overrides if not o.startswith("data.paths=")]
    overrides.append(f"data.paths=[{tmp_path / 'corpus'}/*.jsonl]")
    with pytest.raises(ValueError, match=r"its first record has no 'text' .*its keys: body"):
        run_in_process(overrides)
    assert not (tmp_path / "run").exists()


def test_shards_read_with_another_tokenizer_are_refused_before_training(corpus, tmp_path):
    from data import DataConfig, TokenizerConfig
    from scripts.pretokenize import pretokenize

    text = DataConfig(
        source="local", paths=[f"{corpus}/*.parquet"], tokenizer=TokenizerConfig("bytes")
    )
    pretokenize(text, tmp_path / "shards", shard_tokens=10**6, workers=1)
    overrides = [o for o in tiny_overrides(corpus, tmp_path / "run") if not o.startswith("data")]
    overrides += [
        "data=tokenized",
        f"data.paths=[{tmp_path / 'shards'}/*.bin]",
        "data.seq_len=32",
        "data.validation_documents=8",
        "data.tokenizer.name=llama3",
    ]
    with pytest.raises(ValueError, match=r"written by tokenizer 'bytes' and .*'llama3'"):
        run_in_process(overrides)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.mutation
def test_bad_records_are_counted_once_in_the_metrics(tmp_path):
    """Three broken lines right after the held-out documents: 3 in the logged counters."""
    from data_fixtures import real_documents

    docs = real_documents()
    lines = [json.dumps({"text": d}) for d in docs[:8]]
    lines += ["{not json", json.dumps({"text": 7}), json.dumps(["a list"])]
    lines += [json.dumps({"text": d}) for d in docs[8:200]]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "docs.jsonl").write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tmp_path / "corpus", run_dir, **{"trainer.steps": 6})
    overrides = [o for o in overrides if not o.startswith("data.paths=")]
    overrides.append(f"data.paths=[{tmp_path / 'corpus'}/*.jsonl]")
    assert run_in_process(overrides) == 0
    last = [m for m in metrics(run_dir) if "loss" in m][-1]
    assert last["data/bad_records"] == 3
    assert last["data/documents"] > 0 and last["data/tokens"] > 0


@pytest.mark.slow
def test_a_resume_runs_the_configs_optimizer_settings_not_the_checkpoints(corpus, tmp_path, caplog):
    """Resumed with weight decay 0.5 and betas (0.9, 0.99) after training
    with 0.1 and (0.9, 0.95), the optimizer kept the checkpoint's while config.yaml said the
    config's. The config wins, and the log says what changed."""
    from training.loop import Trainer

    first = tiny_overrides(corpus, tmp_path, **{"trainer.steps": 6})
    assert run_in_process(first) == 0
    changed = {
        "trainer.steps": 12,
        "optim.weight_decay": 0.5,
        "optim.betas": "[0.9,0.99]",
        "optim.eps": 1e-6,
        "optim.scalar_lr_multiplier": 3.0,
        "trainer.allow_changes": "[optim.scalar_lr_multiplier]",  # an axis: on purpose
    }
    config, config_yaml = compose(tiny_overrides(corpus, tmp_path, **changed))
    trainer = Trainer(config, config_yaml)
    try:
        with caplog.at_level("WARNING"):
            trainer.checkpointing.restore(trainer)
        assert trainer.step == 6
        groups = trainer.optimizer.param_groups
        assert {g["weight_decay"] for g in groups} == {0.5, 0.0}  # decayed and undecayed
        assert all(tuple(g["betas"]) == (0.9, 0.99) and g["eps"] == 1e-6 for g in groups)
        assert {g["lr_multiplier"] for g in groups} == {1.0, 3.0}  # the alphas' group
        assert trainer.optimizer.state  # the moments are the checkpoint's
        assert "weight_decay 0.1 -> 0.5 for " in caplog.text
        assert "betas [0.9, 0.95] -> [0.9, 0.99] for " in caplog.text
        assert "lr_multiplier 1.0 -> 3.0 for 4 of " in caplog.text  # 2 layers x 2 alphas
        assert "eps 1e-08 -> 1e-06 for " in caplog.text
    finally:
        trainer.release_model()
