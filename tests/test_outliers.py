"""Outlier telemetry (training/instruments/outliers.py) against closed forms and a planted outlier.

The kurtosis of known distributions (normal 3, uniform 9/5, Laplace 6), the exact fourth central
moment from the raw sums when the mean is far from zero, the same numbers from one batch or its
halves, a single large value planted in one layer's activation output and reported there (and
downstream in the residual stream, not upstream), and a measured step under selective
checkpointing that counts each forward once and leaves the gradients bit for bit as they were.
"""

from __future__ import annotations

import math

import pytest
import torch

from model import Llama
from model.presets import load_preset
from training.instruments.outliers import TENSORS, Recorder, moment_sums, statistics
from training.runtime.parallelize import apply_activation_checkpointing

CPU = torch.device("cpu")


def stats_of(x: torch.Tensor) -> dict[str, float]:
    sums = [float(s) for s in moment_sums(x)]
    rows = x.reshape(-1, x.shape[-1]).abs().amax(dim=-1)
    return statistics([*sums, float(rows.median()), 1.0], float(x.abs().max()))


@pytest.mark.parametrize(
    ("sample", "kurtosis"),
    [
        (lambda g: torch.randn(2000, 1000, generator=g), 3.0),
        (lambda g: torch.rand(2000, 1000, generator=g) * 2 - 1, 9 / 5),
        (
            lambda g: torch.distributions.Laplace(0.0, 1.0).sample((2000, 1000)),
            6.0,
        ),
    ],
    ids=["normal", "uniform", "laplace"],
)
def test_the_kurtosis_of_known_distributions(sample, kurtosis):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    measured = stats_of(sample(g))["kurtosis"]
    # the sampling spread of the kurtosis at 2e6 draws: ~0.003 (normal) to ~0.05 (Laplace)
    assert measured == pytest.approx(kurtosis, rel=0.03)


def test_relu_squared_of_a_normal_input_has_kurtosis_633_over_25():
    # y = relu(z)^2, z ~ N(0, 1): E y = 1/2, E y^2 = 3/2, E y^3 = 15/2, E y^4 = 105/2, so
    # Var = 5/4 and the fourth central moment 633/16: kurtosis 633/25 = 25.32. ReLU²'s output
    # starts far from 3 at initialisation; what the study compares is its growth.
    g = torch.Generator().manual_seed(3)
    y = torch.relu(torch.randn(2000, 1000, generator=g)) ** 2
    assert stats_of(y)["kurtosis"] == pytest.approx(633 / 25, rel=0.05)


def test_the_fourth_central_moment_from_raw_sums_with_a_mean_far_from_zero():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 64, generator=g, dtype=torch.float64).exponential_() * 0.5 + 3.0
    x = x.float()
    centred = x.double() - x.double().mean()
    expected = (centred**4).mean() / (centred**2).mean() ** 2
    assert stats_of(x)["kurtosis"] == pytest.approx(float(expected), rel=1e-6)


def test_max_over_rms_and_the_scaling_units_maxima_in_closed_form():
    # rows of +-1 with one row scaled by 10: RMS sqrt((99 + 100) / 100) over 100 rows of width 8
    x = torch.ones(100, 8)
    x[::2] *= -1
    x[7] *= 10
    s = stats_of(x)
    assert s["amax"] == 10.0
    assert s["max_over_rms"] == pytest.approx(10 / math.sqrt(199 / 100), rel=1e-6)
    assert s["row_amax_median"] == 1.0


def tiny(activation: str = "xielu", layers: int = 3) -> Llama:
    torch.manual_seed(0)
    config = load_preset(
        "tiny", activation=activation, dim=32, n_layers=layers, vocab_size=128, max_seq_len=32
    )
    return Llama(config)


def measured(model: Llama, batches: list[torch.Tensor]) -> tuple[dict[str, float], Recorder]:
    recorder = Recorder(model.layers, CPU)
    try:
        for x in batches:
            model(x[:, :-1], x[:, 1:]).backward()
    finally:
        recorder.remove()
    return recorder.scalars(CPU), recorder


def test_the_recorder_sums_micro_batches_in_float64():
    """Eight micro-batches of a normal sample at mean 30: the fourth central moment cancels
    raw sums near 8e5 down to 3, which float32 sums miss by several percent."""
    g = torch.Generator().manual_seed(0)
    x = 30.0 + torch.randn(64, 1024, generator=g)
    recorder = Recorder(tiny().layers, CPU)
    recorder.remove()
    for part in x.chunk(8):
        recorder.record(0, TENSORS.index("act_out"), part)
    centred = x.double() - x.double().mean()
    expected = (centred**4).mean() / (centred**2).mean() ** 2
    got = recorder.scalars(CPU)["outliers/act_out/kurtosis/layer_00"]
    assert got == pytest.approx(float(expected), rel=1e-3)


def test_a_tensor_of_zeros_has_no_kurtosis_or_ratio_rather_than_a_division_error():
    """A dead layer's output (ReLU² of inputs all below zero) has no spread and no RMS."""
    s = stats_of(torch.zeros(8, 4))
    assert math.isnan(s["kurtosis"]) and math.isnan(s["max_over_rms"])
    assert s["amax"] == 0.0 and s["row_amax_median"] == 0.0


def test_the_row_maxima_median_is_the_mean_of_the_micro_batches_medians():
    recorder = Recorder(tiny().layers, CPU)
    recorder.remove()
    residual = TENSORS.index("residual")
    for scale in (1.0, 3.0):  # rows of +-scale: each micro-batch's median row maximum is scale
        recorder.record(0, residual, scale * torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
    assert recorder.scalars(CPU)["outliers/residual/row_amax_median/layer_00"] == 2.0


def test_a_batch_and_its_halves_give_the_same_statistics():
    x = torch.randint(0, 128, (4, 17), generator=torch.Generator().manual_seed(2))
    whole, _ = measured(tiny(), [x])
    halves, _ = measured(tiny(), [x[:2], x[2:]])
    assert whole.keys() == halves.keys()
    for key in whole:
        if "row_amax_median" in key:
            continue  # a mean of the halves' medians, by definition
        assert halves[key] == pytest.approx(whole[key], rel=1e-5), key


@pytest.mark.parametrize("activation", ["xielu", "swiglu"])
def test_a_planted_outlier_is_reported_in_its_layer_and_downstream_only(activation):
    model = tiny(activation)

    def plant(module, inputs, output):
        output = output.clone()
        output[0, 3, 5] = 1000.0
        return output

    model.layers[1].mlp.act_fn.register_forward_hook(plant)
    x = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(3))
    out, _ = measured(model, [x])
    assert out["outliers/act_out/amax/layer_01"] == 1000.0
    assert out["outliers/act_out/max_over_rms/layer_01"] > 20
    assert out["outliers/act_out/kurtosis/layer_01"] > 100
    for layer in ("00", "02"):
        assert out[f"outliers/act_out/amax/layer_{layer}"] < 50
        assert out[f"outliers/act_out/kurtosis/layer_{layer}"] < 50
    # before the MLP of layer 1: untouched; after it, the residual stream carries it
    assert out["outliers/attn_out/amax/layer_01"] < 50
    residual = [out[f"outliers/residual/max_over_rms/layer_{i:02d}"] for i in range(2)]
    assert residual[1] > 2 * residual[0]


@pytest.mark.parametrize("selective", [True, False])
def test_a_checkpointed_step_is_counted_once_and_its_gradients_are_unchanged(selective):
    x = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(4))
    grads = []
    for measure in (False, True):
        model = tiny()
        apply_activation_checkpointing(model, selective=selective)
        if measure:
            _, recorder = measured(model, [x])
            hidden = model.config.hidden
            counted = recorder.sums[0, 1, 0].item()  # act_out's element count, layer 0
            assert counted == 2 * 16 * hidden
        else:
            model(x[:, :-1], x[:, 1:]).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.mutation
def test_a_run_measures_each_due_step_once_and_trains_as_without_it(corpus, reference, tmp_path):
    """``logging.outliers_every=5`` over 12 steps: steps 5, 10 and the last, each on its own
    forward passes (logged at that step), every layer and tensor; the losses are the
    unmeasured run's bit for bit."""
    from train_helpers import losses, metrics, run_in_process, tiny_overrides
    from training.instruments.outliers import TENSORS

    overrides = tiny_overrides(corpus, tmp_path, **{"logging.outliers_every": 5})
    assert run_in_process(overrides) == 0
    measured = [m for m in metrics(tmp_path) if any(k.startswith("outliers/") for k in m)]
    assert [m["step"] for m in measured] == [5, 10, 12]
    for record in measured:
        keys = [k.split("/") for k in record if k.startswith("outliers/")]
        assert {k[1] for k in keys} == set(TENSORS)
        assert {k[-1] for k in keys} == {"layer_00", "layer_01"}
    assert losses(tmp_path) == reference[1]
    # each measured step's eager stance was left: a compiled run compiles again after it
    assert torch._dynamo.eval_frame._stance.stance == "default"
