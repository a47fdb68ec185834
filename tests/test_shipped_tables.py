"""The numbers docs/ ships are the ones their own rows give: every gap's interval and verdict
recomputed from the per-seed values the table holds (Student's 95% interval and the verdict rule,
written out here), and a study's per-run table read back by its report into the page it wrote."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from train_helpers import ROOT

DOCS = ROOT / "docs"
GAP_TABLES = sorted(p for p in DOCS.rglob("*.csv") if "diff_low" in p.read_text().split("\n")[0])


def rule(low: float, high: float, seeds: int) -> str:
    """A side only where the 95% interval excludes 0."""
    return "ahead" if high < 0 else "behind" if low > 0 else f"not resolved at {seeds} seeds"


def gap_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["diff"]]


@pytest.mark.parametrize("path", GAP_TABLES, ids=lambda p: str(p.relative_to(DOCS)))
def test_each_gaps_verdict_is_the_rule_applied_to_its_own_interval(path):
    rows = gap_rows(path)
    assert rows
    for row in rows:
        low, high, seeds = float(row["diff_low"]), float(row["diff_high"]), int(row["seeds"])
        assert low <= float(row["diff"]) <= high
        assert row["verdict"] == rule(low, high, seeds), row


@pytest.mark.parametrize(
    "path", [p for p in GAP_TABLES if "diffs" in p.read_text().split("\n")[0]], ids=str
)
def test_each_gaps_interval_is_the_one_its_per_seed_gaps_give(path):
    """The per-seed gaps are written to 4 decimals: the mean and interval agree to that."""
    for row in gap_rows(path):
        diffs = [float(d) for d in row["diffs"].split()]
        assert len(diffs) == int(row["seeds"])
        mean = statistics.fmean(diffs)
        half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        expected = (mean, mean - half, mean + half)
        shipped = tuple(float(row[k]) for k in ("diff", "diff_low", "diff_high"))
        assert shipped == pytest.approx(expected, abs=2e-4), row


# a study's per-run table -> the report that reads it back into the page shipped beside it
REPORTS = {
    "docs/apertus/ademamix/width_runs.csv": "scripts.study.width_report",
    "docs/apertus/documents/width_runs.csv": "scripts.study.width_report",
    "docs/apertus/width_runs.csv": "scripts.study.width_report",
    "docs/apertus/goldfish/width_runs.csv": "scripts.study.width_report",
    "docs/optimizers/optimizers_runs.csv": "scripts.study.optimizer_report",
    "docs/optimizers/normuon_rates_runs.csv": "scripts.study.rate_grid",
    "docs/optimizers/muon_rates_runs.csv": "scripts.study.rate_grid",
    "docs/optimizers/muon_one_rate_runs.csv": "scripts.study.optimizer_report",
    "docs/outliers/outliers_runs.csv": "scripts.study.outlier_report",
    "docs/study/study_runs.csv": "scripts.study.study_report",
}
# the reports whose --out is a directory they write the page and its tables into
WRITES_A_DIRECTORY = {
    "scripts.study.outlier_report",
    "scripts.study.study_report",
    "scripts.study.width_report",
}


@pytest.mark.slow
@pytest.mark.parametrize("table", sorted(REPORTS))
def test_a_studys_page_is_what_its_report_makes_of_its_per_run_table(table, tmp_path):
    """The page, and every table the report writes that ships beside it, byte for byte."""
    import importlib

    module = REPORTS[table]
    shipped = ROOT / table
    page = shipped.with_name(shipped.name.removesuffix("_runs.csv") + ".md")
    out = tmp_path if module in WRITES_A_DIRECTORY else tmp_path / page.name
    assert importlib.import_module(module).main([str(shipped), "--out", str(out)]) == 0
    written = {p.name for p in tmp_path.iterdir() if p.suffix in (".md", ".csv")}
    assert {page.name, shipped.name} <= written
    for name in written & {p.name for p in shipped.parent.iterdir()}:
        assert (tmp_path / name).read_text() == (shipped.parent / name).read_text(), name


def test_every_per_run_table_in_the_docs_is_checked_against_its_report():
    tables = {str(p.relative_to(ROOT)) for p in DOCS.rglob("*_runs.csv")}
    assert tables == set(REPORTS)
