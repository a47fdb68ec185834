"""The outlier study's report (scripts/study/outlier_report.py) on runs written out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from eval.runs import Run
from scripts.study.outlier_report import interval, rows, width_effects, worst_layer


def run(activation: str, width: int, seed: int, kurtosis: dict[int, list[float]]) -> Run:
    outliers = {
        step: {
            **{f"outliers/act_out/kurtosis/layer_{i:02d}": v for i, v in enumerate(values)},
            **{f"outliers/act_out/max_over_rms/layer_{i:02d}": 2 * v for i, v in enumerate(values)},
            **{f"outliers/residual/kurtosis/layer_{i:02d}": 3.0 for i in range(len(values))},
        }
        for step, values in kurtosis.items()
    }
    return Run(
        path=Path("."),
        activation=activation,
        init="mup",
        width=width,
        optimizer="adamw",
        rate=0.006,
        lr=0.006,
        seed=seed,
        params=1,
        tokens_per_step=1,
        val={},
        steps=200,
        stable_end=None,
        outliers=outliers,
    )


def test_the_worst_layer_is_the_largest_finite_value():
    values = {
        "outliers/act_out/kurtosis/layer_00": 4.0,
        "outliers/act_out/kurtosis/layer_01": 9.0,
        "outliers/act_out/kurtosis/layer_02": float("nan"),
    }
    assert worst_layer(values, "act_out", "kurtosis") == 9.0


def test_students_interval_over_three_seeds():
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302653 * 1.0 / 3**0.5, rel=1e-6)  # t(0.975, 2) sd / sqrt(3)


def test_growth_and_the_width_effect_are_ratios_paired_by_seed():
    narrow_runs = [
        run("xielu", 64, s, {25: [3.0, 3.0 * s], 200: [3.0, 21.0 * s]}) for s in (1, 2, 3)
    ]
    wide_runs = [run("xielu", 256, s, {25: [3.0, 3.0], 200: [42.0 * s, 3.0]}) for s in (1, 2, 3)]
    runs = narrow_runs + wide_runs
    table = rows(runs)
    narrow = next(
        r
        for r in table
        if r["width"] == 64 and r["statistic"] == "kurtosis" and r["tensor"] == "act_out"
    )
    geometric = math.log(6) / 3  # the mean of log(s) over seeds 1, 2, 3
    assert narrow["early"][0] == pytest.approx(math.log(3) + geometric)
    assert narrow["end"][0] == pytest.approx(math.log(21) + geometric)
    assert math.exp(narrow["growth"][0]) == pytest.approx(7.0)  # every seed grew x7
    assert narrow["growth"][1:] == pytest.approx([narrow["growth"][0]] * 2, abs=1e-9)  # no spread
    (effect,) = [
        w for w in width_effects(table) if w["statistic"] == "kurtosis" and w["tensor"] == "act_out"
    ]
    assert [math.exp(v) for v in effect["difference"]] == pytest.approx([2.0] * 3)  # 42 / 21
