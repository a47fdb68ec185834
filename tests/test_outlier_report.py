"""The outlier study's report (scripts/outlier_report.py) on runs written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.runs import Run
from scripts.outlier_report import interval, rows, width_effects, worst_layer


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


def test_growth_and_the_width_effect_are_paired_by_seed():
    runs = [run("xielu", 64, s, {25: [3.0, 3.0 + s], 200: [3.0, 10.0 + s]}) for s in (1, 2, 3)] + [
        run("xielu", 256, s, {25: [3.0, 3.0], 200: [20.0 + s, 3.0]}) for s in (1, 2, 3)
    ]
    table = rows(runs)
    narrow = next(
        r
        for r in table
        if r["width"] == 64 and r["statistic"] == "kurtosis" and r["tensor"] == "act_out"
    )
    assert narrow["early"][0] == 5.0 and narrow["end"][0] == 12.0
    assert narrow["growth"] == (7.0, 7.0, 7.0)  # every seed grew by 7: no spread
    (effect,) = [
        w for w in width_effects(table) if w["statistic"] == "kurtosis" and w["tensor"] == "act_out"
    ]
    assert effect["difference"] == (10.0, 10.0, 10.0)  # (20 + s) - (10 + s)
