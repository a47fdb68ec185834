"""The width study's report (``scripts/study/width_report.py``) on synthetic run directories: which
rate is best where, the ladder's second stage, and its statistics against closed forms."""

import csv
import json
import math
import statistics

import pytest
import yaml

from eval.runs import read_run
from scripts.study import width_report

T975_2 = 4.302652729911275  # Student's t 0.975 quantile, 2 degrees of freedom (tables)


def fake_run(root, activation, parametrization, dim, lr, seed, final, diverged=False, optim=None):
    """A run directory as the trainer leaves it: config.yaml and metrics.jsonl; ``optim``:
    settings beside ``optim.lr`` (Muon's)."""
    run = root / f"width-{activation}_{parametrization}_dim-{dim}_lr-{lr}_seed-{seed}"
    flat = {
        f"{k}.{inner}" if isinstance(v, dict) else k: w
        for k, v in (optim or {}).items()
        for inner, w in (v.items() if isinstance(v, dict) else [(None, v)])
    }
    run = run.with_name(run.name + "".join(f"_{k}-{v}" for k, v in flat.items()))
    run.mkdir()
    config = {
        "name": "width",
        "model": {
            "dim": dim,
            "n_heads": dim // 32,
            "gated_hidden": 4 * dim,
            "activation": activation,
            "parametrization": parametrization,
            "mup_base_dim": 64,
        },
        "data": {"tokenizer": {"name": "bytes"}, "seq_len": 16},
        "optim": {"lr": lr, **(optim or {})},
        "schedule": {"decay_steps": 2, "warmup_steps": 1},
        "trainer": {"steps": 10, "global_batch": 4, "micro_batch": 4, "seed": seed},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    if diverged:
        records = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": math.nan}]
    elif final is None:  # still running
        records = [{"step": 1, "loss": 3.0}]
    else:
        records = [{"step": s, "val/loss": final + (10 - s) * 0.1} for s in (5, 10)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return run


@pytest.mark.slow
def test_rates_best_per_width_and_their_shift_from_the_base(tmp_path):
    runs = []
    # standard: the best rate halves at each doubling of width; µP: it stays at 4e-3
    best = {("standard", 64): 4e-3, ("standard", 128): 2e-3, ("mup", 64): 4e-3, ("mup", 128): 4e-3}
    for (param, dim), winner in best.items():
        for lr in (2e-3, 4e-3, 8e-3):
            runs.append(
                fake_run(tmp_path, "xielu", param, dim, lr, 0, 2.0 if lr == winner else 2.1)
            )
    runs.append(fake_run(tmp_path, "xielu", "mup", 128, 1.6e-2, 0, None, diverged=True))
    runs.append(fake_run(tmp_path, "xielu", "mup", 128, 3.2e-2, 0, None))  # still running
    rows = width_report.rate_rows([read_run(r) for r in runs], 0, base=64)
    got = {(r["parametrization"], r["width"]): r for r in rows}
    assert got[("standard", 128)]["best_lr"] == 2e-3
    assert got[("standard", 128)]["shift_from_base"] == pytest.approx(0.5)
    assert got[("mup", 128)]["shift_from_base"] == pytest.approx(1.0)
    assert got[("mup", 128)]["losses"][1.6e-2] == math.inf  # diverged: the worst there is
    assert 3.2e-2 not in got[("mup", 128)]["losses"]  # no verdict on a run without an end
    table = "\n".join(width_report.rate_table(rows))
    assert "| mup | xielu | 128 | 2.100 | **2.000** | 2.100 | diverged | 0.004 | x1 |" in table


@pytest.mark.slow
def test_the_ladders_gaps_are_paired_by_seed_and_the_fit_is_a_power_law(tmp_path):
    rates = {"relu2": 4e-3, "xielu": 8e-3}
    relu2 = {1: 2.40, 2: 2.44, 3: 2.42}
    gap = {1: -0.03, 2: -0.04, 3: -0.035}
    runs = []
    for dim in (32, 64, 128):
        scale = (dim / 32) ** -0.1  # losses an exact power law of width
        for seed in (0, 1, 2, 3):
            loss = relu2.get(seed, 9.0) * scale  # seed 0 is the selection seed: left out
            runs.append(fake_run(tmp_path, "relu2", "mup", dim, 4e-3, seed, loss))
            runs.append(
                fake_run(tmp_path, "xielu", "mup", dim, 8e-3, seed, loss + gap.get(seed, 0))
            )
        runs.append(fake_run(tmp_path, "xielu", "mup", dim, 4e-3, 1, 0.5))  # not its rate
    out = tmp_path / "report"
    assert width_report.main([*map(str, runs), "--out", str(out)]) == 0
    rows = {
        (r["activation"], int(r["width"])): r for r in csv.DictReader((out / "ladder.csv").open())
    }
    row = rows[("xielu", 64)]
    diffs = list(gap.values())
    half = T975_2 * statistics.stdev(diffs) / math.sqrt(3)
    assert int(row["seeds"]) == 3
    assert float(row["diff"]) == pytest.approx(statistics.fmean(diffs))
    assert float(row["diff_high"]) == pytest.approx(statistics.fmean(diffs) + half)
    assert row["verdict"] == "ahead"
    # the same gaps at every width: the trend per doubling is 0, its interval the seeds' spread
    ladder_all = width_report.ladder_rows([read_run(p) for p in runs], rates, 0, "relu2")
    xielu_trend = width_report.gap_trends(ladder_all)["xielu"]
    assert xielu_trend.slope == pytest.approx(0, abs=1e-9) and xielu_trend.flat
    assert xielu_trend.n == 3 * 3  # widths x seeds
    assert "no trend resolved" in (out / "width.md").read_text()
    # the per-run table: one row per finished run with its loss; the report reads it back
    table = list(csv.DictReader((out / "width_runs.csv").open()))
    assert len(table) == len(runs)
    row = next(r for r in table if r["run"] == runs[1].name)  # xielu at 32, seed 0
    assert (row["activation"], int(row["width"]), int(row["seed"])) == ("xielu", 32, 0)
    assert float(row["final"]) == pytest.approx(9.0)
    again = tmp_path / "again"
    assert width_report.main([str(out / "width_runs.csv"), "--out", str(again)]) == 0
    assert (again / "width.md").read_text() == (out / "width.md").read_text()
    # the baseline at another rate: its runs at 8e-3 are xielu's, relu2 has none there
    other = tmp_path / "other"
    assert width_report.main([*map(str, runs), "--out", str(other), "--baseline-lr", "8e-3"]) == 0
    assert "relu2" not in {r["activation"] for r in csv.DictReader((other / "ladder.csv").open())}
    ladder = [
        r
        for r in width_report.ladder_rows([read_run(p) for p in runs], rates, 0, "relu2")
        if r["activation"] == "relu2"
    ]
    _, b = width_report.fits(ladder)["relu2"]
    # params grow as about dim^2, loss as dim^-0.1: b close to 0.05 (the embedding is excluded)
    assert 0.04 < b < 0.06
    assert (out / "ladder.png").stat().st_size > 10_000
    assert (out / "learning_rates.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_fixed_rate_stage_is_reported_at_the_rates_given(tmp_path):
    """No seed-0 sweep (the Apertus ingredients): the ladder at the rates named, or at the one
    rate each activation trained at, paired by seed."""
    runs = [
        fake_run(
            tmp_path, activation, "mup", 64, lr, seed, base + (0.05 if activation == "xielu" else 0)
        )
        for activation, lr in (("relu2", 3e-3), ("xielu", 6e-3))
        for seed, base in ((1, 2.3), (2, 2.2), (3, 2.25))
    ]
    out = tmp_path / "report"
    arguments = [*map(str, runs), "--rates", "relu2=0.003", "xielu=0.006", "--out", str(out)]
    assert width_report.main(arguments) == 0
    rows = {r["activation"]: r for r in csv.DictReader((out / "ladder.csv").open())}
    assert float(rows["xielu"]["diff"]) == pytest.approx(0.05) and rows["xielu"]["seeds"] == "3"
    assert not (out / "learning_rates.png").exists()
    # one width and no rate sweep: no empty sections (rates, power laws, trend) and no figure
    page = (out / "width.md").read_text()
    assert page.startswith("## Ladder (µP)\n") and "## Power laws" not in page
    assert "## The gap across widths" not in page
    assert not (out / "ladder.png").exists() and not (out / "rates.csv").exists()
    # without --rates: each activation trained at one rate is read at it
    assert width_report.main([*map(str, runs), "--out", str(tmp_path / "own")]) == 0
    assert (tmp_path / "own" / "ladder.csv").read_text() == (out / "ladder.csv").read_text()
    # a second rate of xielu and no selection run: which is its tuned one is not guessed
    runs.append(fake_run(tmp_path, "xielu", "mup", 64, 1.2e-2, 1, 2.0))
    assert width_report.main([*map(str, runs), "--out", str(tmp_path / "two")]) == 0
    assert "xielu" not in (tmp_path / "two" / "ladder.csv").read_text()


@pytest.mark.slow
def test_muon_runs_are_reported_by_their_muon_rate_and_never_mixed_with_adamw(tmp_path, capsys):
    muon = [
        fake_run(
            tmp_path, "xielu", "mup", 64, 3e-3, 0, loss, optim={"name": "muon", "muon_lr": rate}
        )
        for rate, loss in ((0.02, 2.1), (0.04, 2.0), (0.08, 2.2))
    ]
    (row,) = width_report.rate_rows([read_run(r) for r in muon], 0, base=64)
    assert row["best_lr"] == 0.04 and sorted(row["losses"]) == [0.02, 0.04, 0.08]
    assert width_report.main(list(map(str, muon))) == 0
    assert "## Rates (seed 0, optim.muon.lr)" in capsys.readouterr().out
    adamw = fake_run(tmp_path, "xielu", "mup", 64, 3e-3, 0, 2.0)
    with pytest.raises(SystemExit, match=r"2 optimizers \(adamw, muon\)"):
        width_report.main([*map(str, muon), str(adamw)])


@pytest.mark.slow
def test_two_widths_give_a_trend_but_no_power_law(tmp_path):
    """A power law is fitted over three widths or more: with two the page has the gap's change
    per doubling and no empty power-law table."""
    runs = [
        fake_run(tmp_path, activation, "mup", dim, 6e-3, seed, 2.3 - dim / 1e3 + seed / 100)
        for activation in ("relu2", "xielu")
        for dim in (64, 128)
        for seed in (1, 2, 3)
    ]
    assert width_report.main([*map(str, runs), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "width.md").read_text()
    assert "## The gap across widths" in page and "## Power laws" not in page
