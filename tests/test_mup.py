"""The maximal-update parametrization (``model.parametrization=mup``) against its rules.

Independent truth: Tensor Programs V's table for Adam, as the ``mup`` package implements it
(MuAdam, MuReadout/MuSharedReadout), written out here: with m = dim / base, hidden matrices
start at std x sqrt(1/m) and train at lr / m with weight decay x m; logits are multiplied by
1/m; embeddings, norms, the head's weight and the activation's scalars are untouched.
"""

from __future__ import annotations

import math

import pytest
import torch

from model import Llama
from model.config import ModelConfig
from train_helpers import compose, tiny_overrides
from training.optim import OptimConfig, build_optimizer
from training.parameter_groups import parameter_groups, set_learning_rate


def config(dim: int, **extra) -> ModelConfig:
    values = dict(vocab_size=96, dim=dim, n_layers=2, n_heads=dim // 16, gated_hidden=4 * dim)
    return ModelConfig(**{**values, **extra})


def mup(dim: int, base: int = 32, **extra) -> ModelConfig:
    return config(dim, parametrization="mup", mup_base_dim=base, **extra)


def test_at_the_base_width_mup_is_the_standard_parametrization():
    torch.manual_seed(0)
    standard = Llama(config(32))
    torch.manual_seed(0)
    at_base = Llama(mup(32))
    for (name, a), b in zip(
        standard.state_dict().items(), at_base.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, 96, (2, 12))
    opts = [
        build_optimizer(m, OptimConfig(lr=1e-2), torch.device("cpu")) for m in (standard, at_base)
    ]
    for _ in range(3):
        for model, opt in zip((standard, at_base), opts, strict=True):
            set_learning_rate(opt, 1e-2)
            model(tokens[:, :-1], tokens[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(standard.parameters(), at_base.parameters(), strict=True):
        assert torch.equal(a, b)


@torch.no_grad()
def test_hidden_matrices_start_at_std_over_sqrt_m_and_the_rest_at_std():
    torch.manual_seed(0)
    model = Llama(mup(512, base=32, vocab_size=4096, tie_embeddings=False))
    m, std = 16, 0.02
    layer = model.layers[0]
    for weight in (layer.self_attn.q_proj.weight, layer.mlp.up_proj.weight):
        assert float(weight.std()) == pytest.approx(std / math.sqrt(m), rel=0.02)
    residual = std / math.sqrt(m) / math.sqrt(2 * 2)  # o_proj, down_proj: also 1/sqrt(2 L)
    assert float(layer.mlp.down_proj.weight.std()) == pytest.approx(residual, rel=0.02)
    assert float(model.embed_tokens.weight.std()) == pytest.approx(std, rel=0.02)
    assert float(model.lm_head.weight.std()) == pytest.approx(std, rel=0.02)


def test_the_logits_are_the_heads_output_times_base_over_dim():
    model = Llama(mup(128, base=32, tie_embeddings=False)).eval()
    tokens = torch.randint(0, 96, (2, 10))
    with torch.no_grad():
        x = model.embed_tokens(tokens)
        cos, sin = model.rope_cos[:10], model.rope_sin[:10]
        for layer in model.layers:
            x = layer(x, cos, sin, None)
        by_hand = model.norm(x) @ model.lm_head.weight.T / 4
        torch.testing.assert_close(model(tokens), by_hand, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_hidden_matrices_train_at_lr_over_m_with_weight_decay_times_m(tied):
    model = Llama(mup(128, base=32, tie_embeddings=tied))
    groups = parameter_groups(model, OptimConfig(lr=1e-3, weight_decay=0.1))
    names = {id(p): n for n, p in model.named_parameters()}
    role = {}
    for group in groups:
        for p in group["params"]:
            role[names[id(p)]] = (group["lr_multiplier"], group["weight_decay"])
    for name, (lr_mult, wd) in role.items():
        if name.startswith("layers.") and name.endswith("proj.weight"):
            assert (lr_mult, wd) == (pytest.approx(1 / 4), pytest.approx(0.4)), name
        elif name == "lm_head.weight":  # the readout: a width-independent rate
            assert (lr_mult, wd) == (1.0, 0.1), name
        else:  # embedding, norms, the activation's scalars
            assert lr_mult == 1.0 and wd == 0.0, name
    assert ("lm_head.weight" in role) == (not tied)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3), torch.device("cpu"))
    set_learning_rate(optimizer, 1e-3)
    assert sorted({g["lr"] for g in optimizer.param_groups}) == pytest.approx([2.5e-4, 1e-3])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.parametrization=mup"], r"model\.parametrization=mup needs model\.mup_base_dim"),
        (
            ["model.parametrization=mup", "model.mup_base_dim=16", "model.init_scaling=width"],
            r"model\.init_scaling='width' would scale it twice",
        ),
        (["model.parametrization=mu"], r"model\.parametrization='mu' is not one of"),
        (
            ["model.parametrization=mup", "model.mup_base_dim=24"],  # head_dim 16: 1.5 heads
            r"model\.mup_base_dim=24 is not a multiple of the head dimension 16",
        ),
        (
            ["model.parametrization=mup", "model.mup_base_dim=16", "model.mlp_hidden=51"],
            r"the MLP width 51 \(model\.gated_hidden or model\.mlp_hidden\) does not scale",
        ),
    ],
)
def test_a_mup_setting_the_rules_leave_undefined_stops_before_any_work(
    corpus, tmp_path, overrides, message
):
    with pytest.raises(ValueError, match=message):
        compose([*tiny_overrides(corpus, tmp_path), *overrides])


def test_the_parametrization_names_the_run():
    config, _ = compose(["model.parametrization=mup", "model.mup_base_dim=64"])
    assert {"model.parametrization", "model.mup_base_dim"} <= set(config.trainer.axes)
