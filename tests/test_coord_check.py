"""µP's coordinate check (``scripts/study/coord_check.py``) against µP's own prediction.

Independent truth: Tensor Programs V's width exponents. Under µP every layer's output and its
change in training are Θ(1) in width (slope 0 of log RMS against log width), and the logits
start at width^-1/2 (the readout's 1/m times a sum of ``dim`` random terms). Under the standard
parametrization at a fixed std, a hidden matrix's output at init is std x sqrt(fan_in) (slope
1/2), and an Adam step moves it by about fan_in x lr (slope up to 1). The thresholds sit halfway
between the two predictions; three widths, three steps, 2 layers, on real text.
"""

from __future__ import annotations

import pytest

from scripts.study.coord_check import Setup, check, kind, main, slope, slopes

WIDTHS = [64, 128, 256]
STEPS = 3
# a plain MLP, a gated one, and the trainable activation this project is about
ACTIVATIONS = ["relu2", "swiglu", "xielu"]
GROWS_UNDER_STANDARD = ("pre_activation", "mlp", "block")


@pytest.fixture(scope="module", params=ACTIVATIONS)
def measured(request):
    setup = Setup(activation=request.param, n_layers=2, steps=STEPS, batch=4, seq_len=64)
    rows = check(setup, WIDTHS)
    return slopes(rows, 0, "rms"), slopes(rows, STEPS, "change")


@pytest.mark.slow
def test_under_mup_nothing_moves_with_width(measured):
    at_init, moved = measured
    for (parametrization, _, quantity), value in moved.items():
        if parametrization != "mup":
            continue
        assert abs(value) < 0.3, (quantity, value)
        if quantity == "logits":
            assert at_init[(parametrization, _, quantity)] == pytest.approx(-0.5, abs=0.1)
        else:
            assert abs(at_init[(parametrization, _, quantity)]) < 0.15, quantity


@pytest.mark.slow
def test_under_standard_the_hidden_outputs_and_their_updates_grow(measured):
    at_init, moved = measured
    for (parametrization, _, quantity), value in moved.items():
        if parametrization != "standard":
            continue
        if kind(quantity) in GROWS_UNDER_STANDARD:
            assert value > 0.4, (quantity, value)
        if kind(quantity) == "pre_activation":
            assert at_init[(parametrization, _, quantity)] == pytest.approx(0.5, abs=0.1)
        if kind(quantity) == "embedding":  # a lookup: no fan-in, width-independent in both
            assert abs(value) < 0.3 and abs(at_init[(parametrization, _, quantity)]) < 0.15
        if quantity == "logits":
            # the readout saturates soonest at a large rate; it still grows where µP's does not
            assert value - moved[("mup", _, quantity)] > 0.3, value


def test_slope_is_the_power_laws_exponent():
    widths = [64, 128, 256, 512]
    assert slope(widths, [3.0 * w**0.5 for w in widths]) == pytest.approx(0.5)
    assert slope(widths, [2.0] * 4) == pytest.approx(0.0)


def test_a_width_the_heads_cannot_split_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        main(["--widths", "64", "100"])
    assert "--widths: 100" in capsys.readouterr().err
