"""Muon with AdamW (``training/muon.py``) against its rules written out in float64, its groups,
and the trainer: 2 FSDP2 ranks against 1 process, and a stop on 2 resumed on 1."""

from __future__ import annotations

import pytest
import torch

from faults import faults_env
from model import Llama, ModelConfig
from train_helpers import losses, run, run_in_process, tiny_overrides, with_setting
from training.checks import check_config
from training.config import ExperimentConfig
from training.errors import ConfigError
from training.muon import MuonAdamW, MuonConfig, orthogonalize
from training.optim import OptimConfig, build_optimizer
from training.parameter_groups import parameter_groups

A, B, C = 3.4445, -4.7750, 2.0315  # Muon's quintic Newton-Schulz coefficients


def newton_schulz64(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The iteration as Jordan et al. state it, in float64, on the wide form of ``g``."""
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        s = x @ x.T
        x = A * x + (B * s + C * s @ s) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(8, 24), (24, 8), (16, 16)])
def test_orthogonalize_is_the_iteration_and_flattens_the_spectrum(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    got = orthogonalize(g)
    torch.testing.assert_close(got.double(), newton_schulz64(g), rtol=1e-4, atol=1e-5)
    u, _s, vh = torch.linalg.svd(g.double(), full_matrices=False)
    # the same singular vectors as g, every singular value pulled into about [0.7, 1.2]
    inner = u.T @ got.double() @ vh.T
    assert torch.allclose(inner, torch.diag(torch.diagonal(inner)), atol=1e-4)
    assert torch.diagonal(inner).min() > 0.6 and torch.diagonal(inner).max() < 1.25


@pytest.mark.parametrize("nesterov", [True, False])
def test_a_step_is_the_rule_written_out_matrices_muon_the_rest_adamw(nesterov):
    torch.manual_seed(0)
    matrix = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    vector = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    lr, wd, mu, betas, eps = 0.05, 0.1, 0.95, (0.9, 0.95), 1e-8
    groups = [
        {"params": [matrix], "muon": True, "weight_decay": wd},
        {"params": [vector], "weight_decay": 0.0, "lr": 0.01},
    ]
    optimizer = MuonAdamW(groups, lr=lr, betas=betas, eps=eps, momentum=mu, nesterov=nesterov)
    want_m, want_v = matrix.detach().clone(), vector.detach().clone()
    buffer, m, v = torch.zeros_like(want_m), torch.zeros_like(want_v), torch.zeros_like(want_v)
    for t in range(1, 4):
        g_m, g_v = torch.randn_like(want_m), torch.randn_like(want_v)
        matrix.grad, vector.grad = g_m.clone(), g_v.clone()
        optimizer.step()
        buffer = mu * buffer + (1 - mu) * g_m
        update = (1 - mu) * g_m + mu * buffer if nesterov else buffer
        want_m = want_m * (1 - lr * wd) - lr * (6 / 4) ** 0.5 * newton_schulz64(update)
        m = betas[0] * m + (1 - betas[0]) * g_v
        v = betas[1] * v + (1 - betas[1]) * g_v**2
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        want_v = want_v - 0.01 * m_hat / (v_hat.sqrt() + eps)
    torch.testing.assert_close(matrix.detach(), want_m, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vector.detach(), want_v, rtol=1e-12, atol=1e-12)


def test_a_normuon_step_is_the_rule_written_out():
    """NorMuon (Li et al. 2025) written out in float64: the orthogonalized Nesterov update, each
    row divided by the square root of its running mean square (+ 1e-10), rescaled to the norm
    it had, then Muon's shape factor, rate and decoupled decay."""
    torch.manual_seed(0)
    matrix = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    lr, wd, mu, beta2 = 0.05, 0.1, 0.95, 0.9
    groups = [{"params": [matrix], "muon": True, "weight_decay": wd}]
    optimizer = MuonAdamW(groups, lr=lr, momentum=mu, row_beta2=beta2)
    want, buffer, moment = matrix.detach().clone(), torch.zeros(6, 4, dtype=torch.float64), 0.0
    for _ in range(3):
        g = torch.randn_like(want)
        matrix.grad = g.clone()
        optimizer.step()
        buffer = mu * buffer + (1 - mu) * g
        o = newton_schulz64((1 - mu) * g + mu * buffer)
        moment = beta2 * moment + (1 - beta2) * (o**2).mean(dim=1, keepdim=True)
        normalized = o / (moment.sqrt() + 1e-10)
        normalized = normalized * o.norm() / normalized.norm()
        want = want * (1 - lr * wd) - lr * (6 / 4) ** 0.5 * normalized
    torch.testing.assert_close(matrix.detach(), want, rtol=1e-5, atol=1e-6)
    # with no memory (beta2 = 0) every row of the step has the same norm, and the step Muon's
    fresh = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    start, fresh.grad = fresh.detach().clone(), torch.randn(6, 4, dtype=torch.float64)
    MuonAdamW([{"params": [fresh], "muon": True}], lr=1.0, row_beta2=0.0).step()
    step = start - fresh.detach()
    rows = torch.linalg.vector_norm(step, dim=1)
    torch.testing.assert_close(rows, rows.mean().expand(6), rtol=1e-6, atol=0)
    muon = (6 / 4) ** 0.5 * newton_schulz64((1 - 0.95) * fresh.grad + 0.95 * 0.05 * fresh.grad)
    torch.testing.assert_close(step.norm(), muon.norm(), rtol=1e-5, atol=0)


def test_a_muon_group_takes_matrices_only():
    vector = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=r"^Muon's groups hold 2-D matrices only$"):
        MuonAdamW([{"params": [vector], "muon": True}], lr=0.1)


def test_built_directly_its_groups_default_to_adamw_and_torchs_muon_settings():
    group = MuonAdamW([torch.nn.Parameter(torch.ones(2, 2))], lr=0.1).param_groups[0]
    assert group["muon"] is False and group["betas"] == (0.9, 0.95)
    assert (group["eps"], group["weight_decay"]) == (1e-8, 0.0)
    assert (group["momentum"], group["nesterov"]) == (0.95, True)  # torch.optim.Muon's


def tiny_model(**kwargs) -> Llama:
    return Llama(
        ModelConfig(vocab_size=64, dim=16, n_layers=2, n_heads=2, gated_hidden=32, **kwargs)
    )


@pytest.mark.parametrize("parametrization", ["standard", "mup"])
def test_the_attention_and_mlp_matrices_are_muons_at_its_rate_with_no_mup_factor(
    parametrization,
):
    model = tiny_model(parametrization=parametrization, mup_base_dim=8)
    config = OptimConfig(name="muon", lr=0.004, muon=MuonConfig(lr=0.02), weight_decay=0.1)
    groups = parameter_groups(model, config)
    muon = [g for g in groups if g.get("muon")]
    assert len(muon) == 1
    names = {id(p): n for n, p in model.named_parameters()}
    matrices = [names[id(p)] for p in muon[0]["params"]]
    want = [n for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n]
    want = [n for n in want if not n.startswith("lm_head")]
    assert (
        matrices == want and any("self_attn" in n for n in want) and any("mlp" in n for n in want)
    )
    assert muon[0]["lr_multiplier"] == pytest.approx(0.02 / 0.004)  # spectral: no 1/m
    assert muon[0]["weight_decay"] == 0.1
    rest = [names[id(p)] for g in groups if not g.get("muon") for p in g["params"]]
    assert sorted(rest + matrices) == sorted(names.values())
    assert isinstance(build_optimizer(model, config, torch.device("cpu")), MuonAdamW)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("muon.momentum", 1.0, r"optim\.muon\.momentum=1\.0 must lie in \[0, 1\)"),
        ("fused", True, r"optim\.fused=true: optim\.name=muon has no fused kernel"),
        ("muon.lr", 0.0, r"optim\.muon\.lr"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(key, value, match):
    config = with_setting(ExperimentConfig(), "optim.name", "muon")
    with pytest.raises(ConfigError, match=match):
        check_config(with_setting(config, f"optim.{key}", value))


MUON = {"optim.name": "muon", "optim.muon.lr": 0.02, "parallel.strategy": "fsdp"}
NORMUON = {"optim.name": "normuon", "optim.normuon.lr": 0.02, "parallel.strategy": "fsdp"}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [MUON, NORMUON], ids=["muon", "normuon"])
def test_two_fsdp2_ranks_take_one_process_update_and_a_stop_resumes_on_one(
    corpus, tmp_path, optimizer
):
    """Each sharded matrix orthogonalized whole on one rank (NorMuon: its rows normalized on
    the rank that holds them): 2 FSDP2 ranks follow 1 process on the same data (2 ranks of 1
    data worker read the streams of 1 process with 2) to float32 rounding; stopped on 2 at step
    6 and resumed on 1, the run goes on as the uninterrupted one."""
    one, two = {"data.num_workers": 2}, {"data.num_workers": 1}
    single_dir = tmp_path / "single"
    assert run_in_process(tiny_overrides(corpus, single_dir, **optimizer, **one)) == 0
    single = losses(single_dir)
    assert single[12] < single[1]
    run_dir = tmp_path / "two"
    stop = faults_env(signal="SIGTERM@6")
    code, output = run(tiny_overrides(corpus, run_dir, **optimizer, **two), ranks=2, env=stop)
    assert code == 75, output[-3000:]
    code, output = run(tiny_overrides(corpus, run_dir, **optimizer, **one), ranks=1)
    assert code == 0 and "resumed from" in output, output[-3000:]
    resumed = losses(run_dir)
    assert resumed.keys() == single.keys()
    worst = max(abs(resumed[s] - single[s]) / single[s] for s in single)
    assert worst < 1e-5, worst
