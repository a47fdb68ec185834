"""AdEMAMix against its update rule written out in float64, schedulers included."""

from __future__ import annotations

import math

import pytest
import torch

from model import Llama, ModelConfig
from train_helpers import with_setting
from training.ademamix import AdEMAMix, AdEMAMixConfig, alpha_at, beta3_at
from training.checks import check_config
from training.config import ExperimentConfig
from training.errors import ConfigError
from training.optim import OptimConfig, build_optimizer
from training.parameter_groups import parameter_groups
from training.resume_rules import fixed_changes

BETA1, BETA2, BETA3, ALPHA, EPS = 0.9, 0.999, 0.999, 5.0, 1e-8


def half_life(beta: float) -> float:
    """Steps for a weight of beta^t to fall to 1/2: the paper's quantity the warmup moves."""
    return math.log(0.5) / math.log(beta)


def reference_beta3(step: int, warmup: int) -> float:
    """The paper's beta3 warmup as it is stated: the half-life grows linearly from beta1's to
    beta3's (not the closed form the optimizer computes)."""
    if step >= warmup:
        return BETA3
    a = step / warmup
    h = (1 - a) * half_life(BETA1) + a * half_life(BETA3)
    return 0.5 ** (1 / h)


def reference_run(params, grads_per_step, lrs, decay, alpha_warmup, beta3_warmup):
    """Algorithm 1 of the paper, one float64 number at a time."""
    params = [p.clone().double() for p in params]
    fast = [torch.zeros_like(p) for p in params]
    slow = [torch.zeros_like(p) for p in params]
    square = [torch.zeros_like(p) for p in params]
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs, strict=True), start=1):
        alpha = ALPHA * min(t / alpha_warmup, 1.0) if alpha_warmup else ALPHA
        beta3 = reference_beta3(t, beta3_warmup) if beta3_warmup else BETA3
        for i, g in enumerate(grads):
            g = g.double()
            fast[i] = BETA1 * fast[i] + (1 - BETA1) * g
            slow[i] = beta3 * slow[i] + (1 - beta3) * g
            square[i] = BETA2 * square[i] + (1 - BETA2) * g * g
            fast_hat = fast[i] / (1 - BETA1**t)
            square_hat = square[i] / (1 - BETA2**t)
            update = (fast_hat + alpha * slow[i]) / (square_hat.sqrt() + EPS)
            params[i] = params[i] - lr * (update + decay * params[i])
    return params


def run(params, grads_per_step, lrs, decay, alpha_warmup, beta3_warmup, optimizer=None):
    params = [torch.nn.Parameter(p.clone().double()) for p in params]
    optimizer = optimizer or AdEMAMix(
        params,
        lr=lrs[0],
        betas=(BETA1, BETA2, BETA3),
        alpha=ALPHA,
        alpha_warmup=alpha_warmup,
        beta3_warmup=beta3_warmup,
        eps=EPS,
        weight_decay=decay,
    )
    for grads, lr in zip(grads_per_step, lrs, strict=True):
        for p, g in zip(params, grads, strict=True):
            p.grad = g.double().clone()
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()
    return params, optimizer


def problem(steps: int = 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (7,), ()]
    params = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [
        [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(steps)
    ]
    lrs = [1e-2 * (1 - k / (2 * steps)) for k in range(steps)]  # a decaying schedule
    return params, grads, lrs


@pytest.mark.parametrize(("alpha_warmup", "beta3_warmup"), [(0, 0), (5, 8), (20, 3)])
def test_the_update_is_the_papers_rule_written_out_in_float64(alpha_warmup, beta3_warmup):
    params, grads, lrs = problem()
    want = reference_run(params, grads, lrs, 0.1, alpha_warmup, beta3_warmup)
    got, _ = run(params, grads, lrs, 0.1, alpha_warmup, beta3_warmup)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.detach(), w, rtol=1e-12, atol=1e-14)


def test_beta3_warmup_moves_the_half_life_linearly_from_beta1s_to_beta3s():
    warmup = 100
    assert beta3_at(0, BETA1, BETA3, warmup) == pytest.approx(BETA1, rel=1e-12)
    for step in (1, 25, 50, 99):
        a = step / warmup
        want = (1 - a) * half_life(BETA1) + a * half_life(BETA3)
        got = half_life(beta3_at(step, BETA1, BETA3, warmup))
        assert got == pytest.approx(want, rel=1e-9)
    assert beta3_at(warmup, BETA1, BETA3, warmup) == BETA3
    assert beta3_at(5, BETA1, BETA3, 0) == BETA3  # no warmup


def test_with_beta1_zero_the_warmup_is_the_closed_forms_limit():
    """beta1 = 0 starts at a half-life of 0; the closed form's limit is beta3^(T/t), the value
    the schedule approaches as beta1 -> 0."""
    for step in (1, 10, 50, 99):
        assert beta3_at(step, 0.0, BETA3, 100) == pytest.approx(
            beta3_at(step, 1e-300, BETA3, 100),
            rel=1e-4,  # ln(1e-300) is only -690
        )
        assert beta3_at(step, 0.0, BETA3, 100) < BETA3
    assert beta3_at(0, 0.0, BETA3, 100) == 0.0


def test_alpha_warmup_is_linear_from_zero():
    assert [alpha_at(t, 8.0, 4) for t in range(6)] == [0.0, 2.0, 4.0, 6.0, 8.0, 8.0]
    assert alpha_at(1, 8.0, 0) == 8.0


def test_with_alpha_zero_it_is_torchs_adamw():
    """No slow average mixed in: Adam with decoupled decay, as torch implements it."""
    params, grads, lrs = problem()
    adamw_params = [torch.nn.Parameter(p.clone()) for p in params]
    adamw = torch.optim.AdamW(
        adamw_params, lr=lrs[0], betas=(BETA1, BETA2), eps=EPS, weight_decay=0.1, foreach=True
    )
    for step_grads, lr in zip(grads, lrs, strict=True):
        for p, g in zip(adamw_params, step_grads, strict=True):
            p.grad = g.clone()
        adamw.param_groups[0]["lr"] = lr
        adamw.step()
    mixed = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = AdEMAMix(
        mixed, lr=lrs[0], betas=(BETA1, BETA2, BETA3), alpha=0.0, eps=EPS, weight_decay=0.1
    )
    for step_grads, lr in zip(grads, lrs, strict=True):
        for p, g in zip(mixed, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()
    for a, b in zip(mixed, adamw_params, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-14)


def test_a_state_dict_round_trip_continues_exactly_warmups_included():
    params, grads, lrs = problem()
    want, _ = run(params, grads, lrs, 0.1, 5, 8)
    first, optimizer = run(params, grads[:4], lrs[:4], 0.1, 5, 8)
    state = optimizer.state_dict()
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    fresh = AdEMAMix(
        resumed,
        lr=1.0,
        betas=(BETA1, BETA2, BETA3),
        alpha=ALPHA,
        alpha_warmup=5,
        beta3_warmup=8,
        eps=EPS,
        weight_decay=0.1,
    )
    fresh.load_state_dict(state)
    for step_grads, lr in zip(grads[4:], lrs[4:], strict=True):
        for p, g in zip(resumed, step_grads, strict=True):
            p.grad = g.clone()
        fresh.param_groups[0]["lr"] = lr
        fresh.step()
    for a, b in zip(resumed, want, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=0)
    assert set(fresh.state[resumed[0]]) == {"step", "exp_avg", "exp_avg_slow", "exp_avg_sq"}


def test_a_parameter_without_a_gradient_is_left_alone_and_keeps_its_own_count():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    optimizer = AdEMAMix([a, b], lr=0.1, alpha_warmup=10, beta3_warmup=10)
    a.grad = torch.ones(3)
    optimizer.step()
    b.grad = torch.ones(3)
    optimizer.step()
    assert optimizer.state[a]["step"].item() == 2 and optimizer.state[b]["step"].item() == 1


def tiny_model(**kwargs) -> Llama:
    return Llama(
        ModelConfig(vocab_size=64, dim=16, n_layers=2, n_heads=2, gated_hidden=32, **kwargs)
    )


def test_the_trainer_builds_it_with_adamws_parameter_roles_and_mups_rates():
    model = tiny_model(parametrization="mup", mup_base_dim=8)
    own = AdEMAMixConfig(alpha=8.0, beta3=0.9999, alpha_warmup=7, beta3_warmup=9)
    config = OptimConfig(name="ademamix", ademamix=own, betas=(0.9, 0.999))
    optimizer = build_optimizer(model, config, torch.device("cpu"))
    assert isinstance(optimizer, AdEMAMix)
    groups = parameter_groups(model, config)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [
        g["weight_decay"] for g in groups
    ]
    assert [g.get("lr_multiplier") for g in optimizer.param_groups] == [
        g["lr_multiplier"] for g in groups
    ]
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.999, 0.9999)
    assert (group["alpha"], group["alpha_warmup"], group["beta3_warmup"]) == (8.0, 7, 9)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("name", "adam", r"optim\.name='adam' is not one of adamw, ademamix"),
        ("ademamix.beta3", 1.0, r"optim\.ademamix\.beta3"),
        ("ademamix.alpha", -1.0, r"optim\.ademamix\.alpha must be >= 0"),
        ("ademamix.beta3_warmup", -5, r"optim\.ademamix\.beta3_warmup must be >= 0"),
        ("fused", True, r"optim\.fused=true: optim\.name=ademamix has no fused kernel"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(key, value, match):
    config = with_setting(ExperimentConfig(), "optim.name", "ademamix")
    with pytest.raises(ConfigError, match=match):
        check_config(with_setting(config, f"optim.{key}", value))


def test_a_resume_may_not_change_the_optimizer():
    saved, ours = ExperimentConfig(), ExperimentConfig()
    ours.optim.name = "ademamix"
    assert fixed_changes(saved, ours) == [("optim.name", "adamw", "ademamix")]
    ours.optim.name, ours.optim.ademamix.alpha = "adamw", 3.0  # a setting, not the optimizer
    ours.model.attention = "flex"  # a kernel, not what attention computes
    assert fixed_changes(saved, ours) == []


def test_built_directly_it_defaults_to_apertus_settings_and_refuses_bad_ones():
    p = torch.nn.Parameter(torch.ones(2))
    group = AdEMAMix([p]).param_groups[0]
    assert group["betas"] == (0.9, 0.999, 0.9999) and group["alpha"] == 8.0
    assert (group["lr"], group["eps"], group["weight_decay"]) == (1e-3, 1e-8, 0.0)
    assert (group["alpha_warmup"], group["beta3_warmup"]) == (0, 0)
    AdEMAMix([p], lr=0.0, eps=0.0, weight_decay=0.0, alpha=0.0, betas=(0.0, 0.0, 0.0))  # edges
    bad = [
        {"lr": -1.0},
        {"eps": -1.0},
        {"weight_decay": -0.1},
        {"alpha": -1.0},
        {"betas": (0.9, 0.999)},
        {"betas": (0.9, 0.999, 1.0)},
        {"betas": (-0.1, 0.999, 0.9)},
    ]
    for kwargs in bad:
        with pytest.raises(ValueError, match="AdEMAMix needs"):
            AdEMAMix([p], **kwargs)
    for kwargs in ({"alpha_warmup": -1}, {"beta3_warmup": -1}):
        with pytest.raises(ValueError, match="warmups must be >= 0"):
            AdEMAMix([p], **kwargs)
