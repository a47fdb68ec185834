"""The activation's operating regime: width-aware init, per-layer diagnostics, run identity."""

import json
import math

import numpy as np
import pytest
import torch

from model import Llama, ModelConfig
from train_helpers import metrics, run_in_process, tiny_overrides
from training.instruments.diagnostics import mlp_diagnostics, statistics_from_sums
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize


def _tiny(activation="xielu", **kw) -> Llama:
    config = ModelConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=2, gated_hidden=64, activation=activation, **kw
    )
    torch.manual_seed(0)
    return Llama(config)


def _hand_statistics(x: np.ndarray, y: np.ndarray) -> dict:
    corr = np.corrcoef(x, y)[0, 1]
    return {
        "pre_rms": math.sqrt(np.mean(x**2)),
        "neg_frac": float(np.mean(x < 0)),
        "out_rms": math.sqrt(np.mean(y**2)),
        "nonlinear": 1 - corr**2,
    }


@pytest.mark.parametrize("activation", ["xielu", "swiglu"])
def test_diagnostics_equal_a_hand_computation_of_each_layers_mlp(activation):
    model = _tiny(activation)
    env = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    trained = parallelize(model, env, ParallelConfig())
    tokens = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    batch = {"inputs": tokens, "targets": tokens}
    got = mlp_diagnostics(trained, batch, env.device, (3, 16))
    # by hand: the residual stream block by block, the MLP's input and its activation
    with torch.no_grad():
        cos, sin = model.rope_cos[:16], model.rope_sin[:16]
        x = model.embed_tokens(tokens)
        for layer, stats in zip(model.layers, got, strict=True):
            h = x + layer.self_attn(layer.input_layernorm(x), cos, sin)
            normed = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            if mlp.gated:
                pre, out = (
                    mlp.gate_proj(normed),
                    mlp.act_fn(mlp.gate_proj(normed), mlp.up_proj(normed)),
                )
            else:
                pre = mlp.up_proj(normed)
                out = mlp.act_fn(pre)
            want = _hand_statistics(pre.double().flatten().numpy(), out.double().flatten().numpy())
            assert stats == pytest.approx(want, rel=1e-6, abs=1e-9)
            x = layer(x, cos, sin)


def test_no_held_out_batch_on_any_rank_gives_no_statistics():
    """``data.validation_documents=0``: nothing to measure, nothing logged (it divided by a
    count of zero at step 0 and stopped the run)."""
    env = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    trained = parallelize(_tiny(), env, ParallelConfig())
    assert mlp_diagnostics(trained, None, env.device, (3, 16)) == []


def test_the_statistics_of_known_maps():
    x = np.linspace(-2.0, 2.0, 4001)  # symmetric: mean 0, and 0 itself is not below zero

    def sums(x, y):
        return [
            len(x),
            x.sum(),
            (x * x).sum(),
            (x < 0).sum(),
            y.sum(),
            (y * y).sum(),
            (x * y).sum(),
        ]

    linear = statistics_from_sums(sums(x, 3 * x + 1))
    assert linear["nonlinear"] == pytest.approx(0.0, abs=1e-12)
    assert linear["neg_frac"] == pytest.approx(2000 / 4001)
    assert linear["pre_rms"] == pytest.approx(math.sqrt(np.mean(x**2)))
    square = statistics_from_sums(sums(x, x**2))  # even: uncorrelated with x, all non-linear
    assert square["nonlinear"] == pytest.approx(1.0, abs=1e-12)
    relu = statistics_from_sums(sums(x, np.maximum(x, 0)))
    assert relu["nonlinear"] == pytest.approx(1 - np.corrcoef(x, np.maximum(x, 0))[0, 1] ** 2)


def test_width_aware_initialisation_puts_the_pre_activation_where_the_1b_has_it():
    """RMSNorm feeds the up projection inputs of RMS 1, so its outputs have RMS std * sqrt(dim):
    0.02 * sqrt(1536) = 0.78 at the paper's 1.1B; the width rule gives that at dim 128 too."""
    config = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4, gated_hidden=512)
    width = ModelConfig(**{**config.__dict__, "init_scaling": "width"})
    assert config.effective_init_std == 0.02
    assert width.effective_init_std == pytest.approx(0.02 * math.sqrt(1536 / 128))
    env = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    tokens = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
    measured = {}
    for name, c in (("fixed", config), ("width", width)):
        torch.manual_seed(0)
        model = parallelize(Llama(c), env, ParallelConfig())
        stats = mlp_diagnostics(model, {"inputs": tokens, "targets": tokens}, env.device, (8, 64))
        measured[name] = stats[0]["pre_rms"]
        weights = model.bare.layers[1].mlp.up_proj.weight
        assert weights.std().item() == pytest.approx(c.effective_init_std, rel=0.02)
    assert measured["fixed"] == pytest.approx(0.02 * math.sqrt(128), rel=0.05)
    assert measured["width"] == pytest.approx(0.02 * math.sqrt(1536), rel=0.05)


@pytest.mark.slow
def test_the_trainer_logs_diagnostics_and_validates_at_the_end_of_the_stable_phase(
    corpus, tmp_path
):
    # 12 steps, cooldown in the last 4: the stable phase ends at step 8, which eval_every=5
    # does not hit
    overrides = tiny_overrides(
        corpus, tmp_path, **{"validation.every": 5, "logging.diagnostics_every": 5}
    )
    assert run_in_process(overrides) == 0
    records = metrics(tmp_path)
    val = {r["step"]: r for r in records if "val/loss" in r}
    assert sorted(val) == [5, 8, 10, 12]
    assert all(r["val/tokens"] == 2 * 2 * 32 for r in val.values())  # eval_batches=2 of 2 x 32
    diag = {r["step"]: r for r in records if "diag/pre_rms/layer_00" in r}
    assert sorted(diag) == [0, 5, 10, 12]
    for record in diag.values():
        for layer in ("00", "01"):
            assert 0 < record[f"diag/neg_frac/layer_{layer}"] < 1
            assert 0 <= record[f"diag/nonlinear/layer_{layer}"] <= 1
    # the width at init: std 0.02 over dim 32, as the hand rule says
    assert diag[0]["diag/pre_rms/layer_00"] == pytest.approx(0.02 * math.sqrt(32), rel=0.15)


@pytest.mark.slow
def test_a_run_refuses_the_checkpoints_of_a_run_with_other_axes(corpus, tmp_path):
    base = tiny_overrides(corpus, tmp_path, **{"trainer.steps": 4, "schedule.decay_steps": 1})
    assert run_in_process([*base, "optim.lr=0.002"]) == 0
    axes = json.loads((tmp_path / "axes.json").read_text())
    assert axes["optim.lr"] == 0.002 and axes["model.activation"] == "xielu"
    before = (tmp_path / "metrics.jsonl").read_text()
    refusal = r"optim\.lr: 0\.002 in the run, 0\.004 now"
    with pytest.raises(ValueError, match=refusal):
        run_in_process([*base, "optim.lr=0.004"])
    assert (tmp_path / "metrics.jsonl").read_text() == before  # nothing written
    assert json.loads((tmp_path / "axes.json").read_text()) == axes
    # the comparison is with the config each checkpoint holds: damaged run files change nothing
    config_yaml = (tmp_path / "config.yaml").read_text()
    (tmp_path / "axes.json").write_text('{"optim.l')
    (tmp_path / "config.yaml").write_text(config_yaml[: len(config_yaml) // 2] + ": [")
    with pytest.raises(ValueError, match=refusal):
        run_in_process([*base, "optim.lr=0.004"])
    # a changed key that is not an axis resumes (and trains on to the new end)
    assert run_in_process([*base, "optim.lr=0.002", "trainer.steps=6"]) == 0
    assert max(r["step"] for r in metrics(tmp_path)) == 6
    assert json.loads((tmp_path / "axes.json").read_text()) == axes  # rewritten whole
    # dropping the key from the axes changes it on purpose, and so does allow_changes
    dropped = "trainer.axes=[model.activation,trainer.seed]"
    assert run_in_process([*base, "optim.lr=0.004", "trainer.steps=8", dropped]) == 0
    allowed = "trainer.allow_changes=[optim.lr]"
    assert run_in_process([*base, "optim.lr=0.001", "trainer.steps=9", allowed]) == 0
    with pytest.raises(ValueError, match=r"trainer\.axes: 'optim\.lrr' is not a configuration"):
        run_in_process([*base, "trainer.axes=[optim.lrr]"])
    with pytest.raises(ValueError, match=r"trainer\.allow_changes: 'model\.dimm' is not a"):
        run_in_process([*base, "trainer.allow_changes=[model.dimm]"])
