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
    assert wsd(90, 100, LR, MIN, 10, 20, shape) == pytest.approx(MIN + (LR - MIN) * f(0.5))


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
