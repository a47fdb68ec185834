"""The study's statistics against closed forms, and its report on synthetic run directories."""

import csv
import json
import math
import statistics

import pytest
import yaml

from eval.comparison import paired_difference, power_law_fit, sign_holds, spread, trend, verdict
from scripts.study import study_report
from train_helpers import compose
from training.sweeps import expand

# Student's t 0.975 quantiles (two-sided 95%) from the tables, for 2 and 4 degrees of freedom
T975 = {2: 4.302652729911275, 4: 2.7764451051977987}


def test_the_paired_interval_is_students_t_interval_of_the_differences():
    a = {1: 2.31, 2: 2.27, 3: 2.35, 4: 2.30, 5: 2.28}
    b = {1: 2.33, 2: 2.30, 3: 2.36, 4: 2.34, 5: 2.29, 9: 1.0}  # seed 9 has no partner
    diffs = [a[s] - b[s] for s in a]
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    half = T975[4] * sd / math.sqrt(5)
    got = paired_difference(a, b)
    assert got.n == 5
    assert got.mean == pytest.approx(mean, abs=1e-12)
    assert (got.low, got.high) == pytest.approx((mean - half, mean + half), abs=1e-10)
    assert got.high < 0 and not got.within_noise  # every seed better: a real gap


def test_a_gap_smaller_than_the_seed_noise_is_within_noise():
    a = {1: 2.30, 2: 2.40, 3: 2.35}
    b = {1: 2.32, 2: 2.36, 3: 2.36}
    diffs = [-0.02, 0.04, -0.01]
    half = T975[2] * statistics.stdev(diffs) / math.sqrt(3)
    got = paired_difference(a, b)
    assert (got.low, got.high) == pytest.approx(
        (statistics.fmean(diffs) - half, statistics.fmean(diffs) + half), abs=1e-10
    )
    assert got.within_noise
    assert paired_difference({1: 1.0}, {1: 2.0}).within_noise  # one seed: no interval at all
    with pytest.raises(ValueError, match="share no seed"):
        paired_difference({1: 1.0}, {2: 1.0})


T975_2 = 4.302652729911275  # Student's t, 2 degrees of freedom, 97.5th percentile


@pytest.mark.parametrize(
    "diffs",
    [
        (-0.05, -0.04, -0.06),  # every seed ahead, the interval below 0
        (0.03, 0.04, 0.02),  # behind
        (-0.02, 0.01, -0.03),  # mean below 0, interval across it: a means-only rule says ahead
        (0.012, 0.0135, -0.001),  # mean above 0, interval across it
        (-0.03, -0.03, -0.03),  # no spread: the mean is the interval
    ],
)
def test_a_gap_is_a_side_only_where_its_interval_excludes_0(diffs):
    """The rule, written out: Student's 95% interval of the paired differences; ahead (lower
    loss) where it lies below 0, behind where above, otherwise not resolved at n seeds."""
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    low, high = mean - T975_2 * sd / math.sqrt(3), mean + T975_2 * sd / math.sqrt(3)
    expected = "ahead" if high < 0 else "behind" if low > 0 else "not resolved at 3 seeds"
    base = {1: 2.0, 2: 2.1, 3: 2.2}
    got = verdict(
        paired_difference({s: base[s] + d for s, d in zip(base, diffs, strict=True)}, base)
    )
    assert got == expected
    assert verdict(paired_difference({1: 1.0}, {1: 2.0})) == "not resolved at 1 seed"


def test_a_sign_holds_only_where_every_cell_resolves_the_same_way():
    assert sign_holds(["ahead", "ahead"]) == "ahead"
    assert sign_holds(["behind"]) == "behind"
    assert sign_holds(["ahead", "not resolved at 3 seeds"]) is None  # the means may agree
    assert sign_holds(["ahead", "behind"]) is None
    assert sign_holds([]) is None


def test_spread_and_the_power_law_fit():
    s = spread([1.0, 2.0, 4.0])
    assert (s.mean, s.n) == (pytest.approx(7 / 3), 3)
    assert s.std == pytest.approx(
        math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    )
    sizes = [1e5, 4e5, 1.6e6, 6.4e6]
    a, b = power_law_fit(sizes, [3.0 * n**-0.07 for n in sizes])
    assert (a, b) == (pytest.approx(3.0, rel=1e-9), pytest.approx(0.07, rel=1e-9))


def _fake_run(root, activation, init, lr, seed, final, dim=64, curve_offset=0.0):
    """A run directory as the trainer leaves it: config.yaml and metrics.jsonl."""
    run = root / f"study-{activation}_init_scaling-{init}_lr-{lr}_seed-{seed}"
    run.mkdir()
    config = {
        "name": "study",
        "model": {
            "dim": dim,
            "n_heads": 2,
            "gated_hidden": 4 * dim,
            "activation": activation,
            "init_scaling": init,
        },
        "data": {"tokenizer": {"name": "bytes"}, "seq_len": 16},
        "optim": {"lr": lr},
        "schedule": {"decay_steps": 2, "warmup_steps": 1},
        "trainer": {"steps": 10, "global_batch": 4, "micro_batch": 4, "seed": seed},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    records = [{"step": s, "val/loss": final + (10 - s) * 0.1 + curve_offset} for s in (4, 8, 10)]
    records.append({"step": 0, "diag/pre_rms/layer_00": 0.2, "diag/pre_rms/layer_01": 0.3})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return run


@pytest.mark.slow
def test_the_report_picks_the_rate_on_seed_0_and_reports_the_other_seeds(tmp_path):
    runs = []
    # seed 0 (selection): relu2 is best at 2e-3, xielu at 4e-3
    for act, losses in {"relu2": (2.50, 2.40, 2.45), "xielu": (2.60, 2.50, 2.42)}.items():
        for lr, loss in zip((1e-3, 2e-3, 4e-3), losses, strict=True):
            runs.append(_fake_run(tmp_path, act, "width", lr, 0, loss))
    # seeds 1-3 at the chosen rates, and a decoy at a rate that was not chosen
    relu2 = {1: 2.40, 2: 2.44, 3: 2.42}
    xielu = {1: 2.37, 2: 2.40, 3: 2.38}
    for seed in (1, 2, 3):
        runs.append(_fake_run(tmp_path, "relu2", "width", 2e-3, seed, relu2[seed]))
        runs.append(_fake_run(tmp_path, "xielu", "width", 4e-3, seed, xielu[seed]))
        runs.append(_fake_run(tmp_path, "xielu", "width", 1e-3, seed, 1.0))
    out = tmp_path / "report"
    sweep_file = tmp_path / "seeds.yaml"
    argv = [*map(str, runs), "--out", str(out), "--seeds-sweep", str(sweep_file)]
    assert study_report.main(argv) == 0
    rows = {r["activation"]: r for r in csv.DictReader((out / "study.csv").open())}
    assert float(rows["relu2"]["best_lr"]) == 2e-3 and float(rows["xielu"]["best_lr"]) == 4e-3
    assert rows["xielu"]["best_lr_at_edge"] == "True"
    assert int(rows["xielu"]["seeds"]) == 3  # the seed-0 run and the 1e-3 decoys are left out
    assert float(rows["xielu"]["final_mean"]) == pytest.approx(statistics.fmean(xielu.values()))
    assert float(rows["xielu"]["final_std"]) == pytest.approx(statistics.stdev(xielu.values()))
    # the end of the stable phase is step 8: two steps of 0.1 above the final loss here
    assert float(rows["xielu"]["stable_mean"]) == pytest.approx(
        statistics.fmean(xielu.values()) + 0.2
    )
    diffs = [xielu[s] - relu2[s] for s in (1, 2, 3)]
    half = T975[2] * statistics.stdev(diffs) / math.sqrt(3)
    assert float(rows["xielu"]["diff"]) == pytest.approx(statistics.fmean(diffs))
    assert float(rows["xielu"]["diff_low"]) == pytest.approx(statistics.fmean(diffs) - half)
    assert rows["xielu"]["verdict"] == "ahead"
    markdown = (out / "study.md").read_text()
    assert "| xielu | width | 64 | 0.004 (edge) (0.001 0.002 0.004) | 3 |" in markdown
    for figure in ("curves.png", "learning_rates.png", "diagnostics.png"):
        assert (out / figure).stat().st_size > 10_000, figure
    # the second stage's sweep: each arm at its rate, on seeds 1-3, each point its own directory
    jobs = expand(yaml.safe_load(sweep_file.read_text()))
    assert len(jobs) == 6
    assert "optim.lr=0.004" in jobs[3] and "activation=xielu" in jobs[3]
    run_dirs = {compose(job)[0].trainer.run_dir for job in jobs}
    assert "runs/study-xielu_lr-0.004_seed-2" in run_dirs and len(run_dirs) == 6


def test_the_trend_is_the_least_squares_slope_with_students_interval():
    xs = [5.0, 5.0, 6.0, 6.0, 7.0, 7.0]  # log2 widths 32, 64, 128, two seeds each
    ys = [0.10, 0.12, 0.07, 0.08, 0.03, 0.06]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    stderr = math.sqrt(sum(r * r for r in residuals) / (len(xs) - 2) / sxx)
    half = T975[4] * stderr
    got = trend(xs, ys)
    assert got.slope == pytest.approx(slope, abs=1e-12)
    assert (got.low, got.high) == pytest.approx((slope - half, slope + half), abs=1e-10)
    assert got.high < 0 and not got.flat  # the gap falls by about 0.03 per doubling
    assert trend([1.0, 2.0, 3.0], [0.1, -0.1, 0.1]).flat
    with pytest.raises(ValueError, match="two or more x values"):
        trend([1.0, 1.0, 1.0], [0.1, 0.2, 0.3])


@pytest.mark.slow
def test_a_report_on_the_second_stage_alone_draws_no_empty_rate_figure(tmp_path):
    """Without the selection seed's runs there is no rate to plot: the figure the first stage
    drew is left as it is, not replaced by empty axes, and the table names the one rate run."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "learning_rates.png").write_bytes(b"the first stage's figure")
    runs = [
        _fake_run(tmp_path, act, "width", lr, seed, 2.4 + seed / 100)
        for act, lr in (("relu2", 2e-3), ("xielu", 4e-3))
        for seed in (1, 2, 3)
    ]
    assert study_report.main([*map(str, runs), "--out", str(out)]) == 0
    assert (out / "learning_rates.png").read_bytes() == b"the first stage's figure"
    assert "| xielu | width | 64 | 0.004 | 3 |" in (out / "study.md").read_text()
