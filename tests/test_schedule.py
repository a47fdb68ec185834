"""Learning-rate schedules pinned at every phase boundary."""

import math

import pytest

from training.schedule import cosine, wsd

LR, MIN = 8e-4, 1e-5


def test_wsd_warmup_is_linear_and_reaches_the_peak():
    assert wsd(0, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR / 10)
    assert wsd(4, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR / 2)
    assert wsd(9, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR)


def test_wsd_is_constant_until_the_cooldown_starts():
    assert wsd(10, 100, LR, MIN, 10, 20, "1-sqrt") == LR
    assert wsd(79, 100, LR, MIN, 10, 20, "1-sqrt") == LR
    assert wsd(80, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR)  # p = 0


def test_wsd_cooldown_follows_one_minus_sqrt():
    for step in (85, 90, 99):
        p = (step - 80) / 20
        expected = MIN + (LR - MIN) * (1 - math.sqrt(p))
        assert wsd(step, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(expected)
    assert wsd(100, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(MIN)


@pytest.mark.parametrize(
    "shape,f", [("linear", lambda p: 1 - p), ("cosine", lambda p: (1 + math.cos(math.pi * p)) / 2)]
)
def test_wsd_other_cooldown_shapes(shape, f):
    # p = 0.5 alone cannot tell the cosine from (1 - cos) / 2 or 0.5 / (1 + cos): all give 0.5
    for step in (85, 90, 95):
        p = (step - 80) / 20
        assert wsd(step, 100, LR, MIN, 10, 20, shape) == pytest.approx(MIN + (LR - MIN) * f(p))


def test_an_unknown_cooldown_shape_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"schedule\.decay_shape='square' is not one of"):
        wsd(90, 100, LR, MIN, 10, 20, "square")


def test_past_the_last_step_both_schedules_hold_the_floor():
    """A schedule asked beyond its total (a plot, a run extended by hand) stays at min_lr
    instead of turning back up."""
    for step in (100, 110, 150):
        assert wsd(step, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(MIN)
        assert wsd(step, 100, LR, MIN, 10, 20, "cosine") == pytest.approx(MIN)
        assert cosine(step, 100, LR, MIN, 10) == pytest.approx(MIN)
    # one step after the warmup: the whole decay lasts one step
    assert cosine(10, 11, LR, MIN, 10) == pytest.approx(LR)
    assert cosine(11, 11, LR, MIN, 10) == pytest.approx(MIN)


def test_paper_1b_schedule_phases():
    # 2000 warmup + 53500 stable + 14500 cooldown = 70000 steps, min lr 0
    assert wsd(1999, 70000, 8e-4, 0.0, 2000, 14500, "1-sqrt") == pytest.approx(8e-4)
    assert wsd(55499, 70000, 8e-4, 0.0, 2000, 14500, "1-sqrt") == 8e-4
    quarter = 55500 + 14500 // 4
    assert wsd(quarter, 70000, 8e-4, 0.0, 2000, 14500, "1-sqrt") == pytest.approx(
        8e-4 * (1 - math.sqrt(0.25)), rel=1e-3
    )


def test_cosine_warmup_then_half_cosine_to_min():
    # the ablation schedule: 6e-4 -> 6e-5 after 200 warmup steps, 50000 steps in all
    assert cosine(199, 50000, 6e-4, 6e-5, 200) == pytest.approx(6e-4)
    assert cosine(200, 50000, 6e-4, 6e-5, 200) == pytest.approx(6e-4)
    assert cosine(200 + 24900, 50000, 6e-4, 6e-5, 200) == pytest.approx(3.3e-4)
    assert cosine(50000, 50000, 6e-4, 6e-5, 200) == pytest.approx(6e-5)
