"""FP8 training through torchao (``parallel.float8``, training/runtime/float8.py), on a CPU.

A CPU has no FP8 matmuls, so the numerics run through torchao's emulation (the operands rounded
to float8 e4m3 with their scales, multiplied in fp32) and are checked against a float8 rounding
written out here from the recipe's definition: scale = 448 / amax (per tensor, or per row of
each operand), rounded down to a power of two where the recipe says so. The refusals, the
choice of layers, the unchanged checkpoint names and the checkpointing policy are checked
directly; tokens/s and the loss against bf16 need a GPU (docs/performance.md).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

pytest.importorskip("torchao.float8", reason="the fp8 extra: pip install -e '.[fp8]'")

from model import Llama
from model.presets import load_preset
from training.checks import check_config, check_on_device
from training.config import ExperimentConfig
from training.errors import ConfigError
from training.runtime import float8
from training.runtime.parallelize import (
    ParallelConfig,
    matmul_policy,
)

E4M3_MAX = 448.0
CPU = torch.device("cpu")


def tiny(dim=64, activation="xielu") -> Llama:
    torch.manual_seed(0)
    config = load_preset(
        "tiny", activation=activation, dim=dim, n_layers=2, vocab_size=256, max_seq_len=32
    )
    return Llama(config)


def rounded(t: torch.Tensor, rowwise: bool, power_of_two: bool) -> torch.Tensor:
    """``t`` as float8 e4m3 holds it, scaled back: the reference for one operand."""
    amax = t.abs().amax(dim=-1, keepdim=True) if rowwise else t.abs().amax()
    scale = E4M3_MAX / amax.double().clamp(min=1e-12)
    if power_of_two:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    scale = scale.float()
    q = (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.float() / scale


# ----------------------------------------------------------------------------- refusals


def test_every_recipe_is_refused_on_a_cpu_before_any_work_saying_what_to_do():
    for recipe in ("tensorwise", "rowwise"):
        why = float8.refusal(recipe, "bf16", CPU)
        assert "CUDA GPU" in why and "parallel.float8=none" in why
    assert float8.refusal("none", "fp32", CPU) is None


def test_float8_needs_bf16_autocast_and_says_so():
    """On a GPU (the CPU is refused first, for the device: no precision makes it run there)."""
    why = float8.refusal("tensorwise", "fp32", torch.device("cuda"))
    assert "parallel.precision=bf16" in why


def test_without_torchao_the_refusal_names_the_extra(monkeypatch):
    monkeypatch.setattr(float8, "torchao_available", lambda: False)
    why = float8.refusal("rowwise", "bf16", CPU)
    assert "pip install -e '.[fp8]'" in why


def test_the_device_check_refuses_float8_here_and_the_plan_only_carries_the_settings():
    """Refused from ``training.checks`` before the model is built; the plan restates no check,
    so evaluating an FP8 run's checkpoint on a CPU (``.for_evaluation()``) is not refused."""
    config = ExperimentConfig(parallel=ParallelConfig(float8="tensorwise", precision="bf16"))
    with pytest.raises(ConfigError, match=r"parallel\.float8=tensorwise"):
        check_on_device(config, CPU)
    assert config.parallel.on(CPU).for_evaluation().float8 == "none"
    plan = ParallelConfig(float8_keep=["lm_head", "down_proj"]).on(CPU)
    assert plan.float8 == "none" and plan.float8_keep == ["lm_head", "down_proj"]


def test_an_unknown_recipe_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"parallel\.float8='blockwise' is not one of"):
        check_config(ExperimentConfig(parallel=ParallelConfig(float8="blockwise")))


# ----------------------------------------------------------------------------- which layers


def test_every_block_linear_converts_and_the_lm_head_stays():
    model = tiny()
    names = float8.convert(model, "tensorwise", auto_filter=False, emulate=True)
    block_linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert "lm_head" not in names and len(names) == len(block_linears) - 1
    from torchao.float8.float8_linear import Float8Linear

    assert not isinstance(model.lm_head, Float8Linear)
    assert all(isinstance(model.get_submodule(n), Float8Linear) for n in names)


def test_kept_names_match_whole_names_or_suffixes():
    model = tiny()
    names = float8.convert(
        model, "rowwise", keep=("lm_head", "down_proj", "layers.0.mlp.up_proj"), auto_filter=False
    )
    assert not any(n.endswith("down_proj") for n in names)
    assert "layers.0.mlp.up_proj" not in names and "layers.1.mlp.up_proj" in names
    assert not float8.kept_by_name("layers.0.mlp.up_proj", ["p_proj"])  # no partial words


def test_shapes_fp8_cannot_take_and_small_layers_stay_bf16():
    model = tiny(dim=40)  # 40 is not a multiple of 16
    assert float8.convert(model, "tensorwise", auto_filter=False) == []
    # torchao's size filter: a 64-wide model is far below where FP8 pays on an H100
    assert float8.convert(tiny(), "tensorwise", auto_filter=True) == []


def test_the_size_filter_judges_each_layer_and_the_ones_it_leaves_stay_plain_linears():
    """torchao's tensorwise heuristic converts a layer only with K > 4096 or N > 1024 (its H100
    measurements): the 2048-wide output converts, the 64-wide one stays a plain ``nn.Linear``."""
    model = torch.nn.ModuleDict(
        {
            "wide": torch.nn.Linear(64, 2048, bias=False),
            "narrow": torch.nn.Linear(2048, 64, bias=False),
        }
    )
    assert float8.convert(model, "tensorwise", keep=(), auto_filter=True) == ["wide"]
    assert type(model["narrow"]) is torch.nn.Linear and type(model["wide"]) is not torch.nn.Linear


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_only_tensorwise_all_gathers_in_float8_and_only_under_fsdp2(recipe):
    """By default (as the trainer calls it on a GPU): torchao's size filter on, no emulation, no
    float8 all-gather; the recipe sets the scaling granularity."""
    from torchao.float8.config import ScalingGranularity

    assert float8.convert(tiny(), recipe) == []  # the size filter is on by default
    granularity = {
        "tensorwise": ScalingGranularity.TENSORWISE,
        "rowwise": ScalingGranularity.AXISWISE,
    }[recipe]
    for fsdp in (None, False, True):  # None: the default, not sharded
        model = tiny()
        asked = {} if fsdp is None else {"fsdp": fsdp}
        (first, *_) = float8.convert(model, recipe, auto_filter=False, **asked)
        config = model.get_submodule(first).config
        assert config.enable_fsdp_float8_all_gather == bool(fsdp and recipe == "tensorwise")
        assert config.emulate is False
        assert config.cast_config_weight.scaling_granularity == granularity


def test_conversion_keeps_the_checkpoint_names_and_fp32_weights():
    plain, converted = tiny(), tiny()
    float8.convert(converted, "tensorwise", auto_filter=False, emulate=True)
    a, b = plain.state_dict(), converted.state_dict()
    assert list(a) == list(b)
    for name in a:
        assert b[name].dtype == a[name].dtype
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0)


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_an_emulated_float8_linear_multiplies_the_float8_rounded_operands(recipe):
    torch.manual_seed(1)
    layer = nn.Sequential(nn.Linear(64, 32, bias=False))
    weight = layer[0].weight.detach().clone()
    float8.convert(layer, recipe, keep=(), auto_filter=False, emulate=True)
    x = torch.randn(8, 64) * torch.logspace(-2, 1, 64)  # columns of very different sizes
    out = layer(x)
    rowwise = recipe == "rowwise"
    power_of_two = layer[0].config.round_scales_to_power_of_2
    expected = rounded(x, rowwise, power_of_two) @ rounded(weight, rowwise, power_of_two).T
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # and float8 is not exact: the reference differs from the fp32 product
    assert (x @ weight.T - expected).abs().max() > 1e-4


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_float8_gradients_stay_within_float8s_error_of_fp32(recipe):
    torch.manual_seed(2)
    plain = nn.Sequential(nn.Linear(64, 48, bias=False))
    converted = nn.Sequential(nn.Linear(64, 48, bias=False))
    converted.load_state_dict(plain.state_dict())
    float8.convert(converted, recipe, keep=(), auto_filter=False, emulate=True)
    x = torch.randn(16, 64, dtype=torch.float64).float()
    grad = torch.randn(16, 48)
    grads = []
    for model in (plain, converted):
        xi = x.clone().requires_grad_()
        model(xi).backward(grad)
        grads.append((xi.grad, model[0].weight.grad))
    for exact, fp8 in zip(grads[0], grads[1], strict=True):
        relative = (fp8 - exact).norm() / exact.norm()
        assert 1e-4 < relative < 0.08  # e4m3 keeps 3 mantissa bits: ~2-4% per operand


def test_a_selectively_checkpointed_float8_model_trains_like_the_plain_one():
    from training.runtime.parallelize import apply_activation_checkpointing

    x = torch.randint(0, 256, (2, 33))
    losses = []
    for recipe in ("none", "tensorwise"):
        model = tiny()
        if recipe != "none":
            float8.convert(model, recipe, auto_filter=False, emulate=True)
        apply_activation_checkpointing(model, selective=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        losses.append(float(loss))
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert abs(losses[0] - losses[1]) < 0.02 * losses[0]


# ----------------------------------------------------------------------------- the policy


class _Context:
    def __init__(self, recompute: bool) -> None:
        self.is_recompute = recompute


def test_selective_checkpointing_saves_float8_matmuls_as_it_saves_mm():
    from torch.utils.checkpoint import CheckpointPolicy

    policy = matmul_policy(linears_per_block=3)
    scaled_mm, mm = torch.ops.aten._scaled_mm.default, torch.ops.aten.mm.default
    forward = [policy(_Context(False), op) for op in (scaled_mm, mm, scaled_mm)]
    # the first two linears are kept, the block's last (the down projection) is recomputed
    assert forward == [CheckpointPolicy.MUST_SAVE] * 2 + [CheckpointPolicy.PREFER_RECOMPUTE]
    assert policy(_Context(False), torch.ops.aten.max.default) == CheckpointPolicy.MUST_SAVE
    assert policy(_Context(False), torch.ops.aten.abs.default) == (
        CheckpointPolicy.PREFER_RECOMPUTE
    )
    # recomputation counts on its own
    assert policy(_Context(True), scaled_mm) == CheckpointPolicy.MUST_SAVE


def test_the_fsdp_scale_precompute_runs_only_for_tensorwise_under_fsdp(monkeypatch):
    import torchao.float8

    class Wrapped:
        def __init__(self, recipe, fsdp):
            self.plan, self.fsdp, self.bare = ParallelConfig(float8=recipe), fsdp, nn.Linear(2, 2)

    def built(wrapped: Wrapped):  # as the trainer builds its shipped components
        return float8.Float8Scales.from_context(SimpleNamespace(model=wrapped))

    wrapped = Wrapped("tensorwise", True)
    found = [built(wrapped)]
    assert isinstance(found[0], float8.Float8Scales)
    assert built(Wrapped("rowwise", True)) is None
    assert built(Wrapped("tensorwise", False)) is None
    # after an update, over the bare model's weights; a skipped update changed no weight
    precomputed = []
    monkeypatch.setattr(
        torchao.float8, "precompute_float8_dynamic_scale_for_fsdp", precomputed.append
    )
    found[0].after_update(None, 1, stepped=False)
    assert precomputed == []
    found[0].after_update(None, 1, stepped=True)
    assert precomputed == [wrapped.bare]


# ----------------------------------------------------------------------------- under FSDP2


def fsdp_ranks(rank: int, world_size: int, root: str, recipe: str) -> None:
    """Two gloo ranks: the float8 model sharded with FSDP2 (bf16 all-gather: gloo has no
    float8 collectives), every rank fed the same batch; rank 0 also runs it unsharded, and the
    model without float8, unsharded. Writes the losses and one weight's gradients to ``root``."""
    import torch.distributed as dist

    from training.runtime.parallelize import apply_fsdp

    dist.init_process_group(
        "gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=world_size
    )
    x = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(5))
    results = {}
    for kind in ("sharded", "whole", "plain") if rank == 0 else ("sharded",):
        model = tiny()
        if recipe != "none" and kind != "plain":
            float8.convert(model, recipe, auto_filter=False, emulate=True)
        if kind == "sharded":
            apply_fsdp(model, ParallelConfig(strategy="fsdp", precision="bf16"))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        grad = model.layers[0].mlp.up_proj.weight.grad
        grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        results[kind] = (loss.detach(), grad)
    if rank == 0:
        torch.save(results, f"{root}/results.pt")
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes each, ~6 s
@pytest.mark.parametrize("recipe", ["none", "tensorwise", "rowwise"])
def test_float8_layers_sharded_with_fsdp2_train_as_unsharded(tmp_path, recipe):
    torch.multiprocessing.spawn(fsdp_ranks, args=(2, str(tmp_path), recipe), nprocs=2)
    results = torch.load(tmp_path / "results.pt")
    (loss, grad), (loss_whole, grad_whole) = results["sharded"], results["whole"]
    # the same batch on both ranks: their average is the unsharded gradient
    if recipe == "none":
        torch.testing.assert_close(loss, loss_whole, rtol=0, atol=0)
        torch.testing.assert_close(grad, grad_whole, rtol=0, atol=0)
        return
    # with float8, FSDP2 quantizes the bf16-gathered weight where one process quantizes the
    # fp32 one: another rounding to e4m3, no larger an error against the model without float8
    torch.testing.assert_close(loss, loss_whole, rtol=1e-3, atol=0)
    exact = results["plain"][1]

    def error(g):
        return float((g - exact).norm() / exact.norm())

    assert error(grad) < 2 * error(grad_whole) and error(grad) < 0.2
