"""The outlier study's report (scripts/study/outlier_report.py) on runs written out by hand."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from eval.runs import Run
from scripts.study import outlier_report
from scripts.study.outlier_report import interval, per_run, rows, width_effects, worst_layer


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
    table = rows(per_run(runs))
    narrow = next(
        r
        for r in table
        if r["width"] == 64 and r["statistic"] == "kurtosis" and r["tensor"] == "act_out"
    )
    geometric = math.log(6) / 3  # the mean of log(s) over seeds 1, 2, 3
    assert narrow["early_log_mean"] == pytest.approx(math.log(3) + geometric)
    assert narrow["end_log_mean"] == pytest.approx(math.log(21) + geometric)
    assert math.exp(narrow["growth_log"]) == pytest.approx(7.0)  # every seed grew x7
    no_spread = [narrow["growth_log"]] * 2
    assert [narrow["growth_log_low"], narrow["growth_log_high"]] == pytest.approx(
        no_spread, abs=1e-9
    )
    (effect,) = [
        w for w in width_effects(table) if w["statistic"] == "kurtosis" and w["tensor"] == "act_out"
    ]
    assert [math.exp(v) for v in effect["difference"]] == pytest.approx([2.0] * 3)  # 42 / 21


def test_the_report_reads_its_per_run_table_back_into_the_same_tables(tmp_path):
    runs = [
        run(a, 64, s, {25: [3.0, 2.0 * s], 200: [5.0 * s, 4.0]})
        for a in ("relu2", "xielu")
        for s in (1, 2, 3)
    ]
    values = per_run(runs)
    assert len(values) == len(runs) * len(outlier_report.REPORTED)
    table = tmp_path / "outliers_runs.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=outlier_report.RUN_COLUMNS)
        writer.writeheader()
        writer.writerows(values)
    out = tmp_path / "out"
    assert outlier_report.main([str(table), "--out", str(out)]) == 0
    expected = outlier_report.tables(rows(values), width_effects(rows(values)))
    assert (out / "outliers.md").read_text() == "\n".join(expected) + "\n"
    assert not (out / "outliers.png").exists()  # no curves without the run directories
    again = out / "again"
    assert outlier_report.main([str(out / "outliers_runs.csv"), "--out", str(again)]) == 0
    assert (again / "outliers_runs.csv").read_text() == (out / "outliers_runs.csv").read_text()
