"""The optimizer study's report (``scripts/study/optimizer_report.py``) on synthetic run
directories: each optimizer's rates from its own selection runs, the gaps paired by seed
against Student's interval written out, and the sign verdict by the rule written out here: a
side only where the interval excludes 0, the sign held only where every cell resolves the same
way."""

import csv
import math
import statistics

import pytest
from test_width_report import T975_2, fake_run

from eval.runs import read_run
from scripts.study import optimizer_report

# the optimizers' settings beside optim.lr, and (rate on the selection seed -> loss): the
# lower loss is the rate the ladder must use; AdamW's rates are optim.lr, Muon's optim.muon.lr
OPTIMIZERS = {
    "adamw": (None, {3e-3: 2.30, 6e-3: 2.20}),
    "ademamix": ({"name": "ademamix"}, {1.5e-3: 2.40, 3e-3: 2.45}),
    "muon": ({"name": "muon"}, {0.02: 2.25, 0.04: 2.15}),
}
BASELINE = {1: 2.30, 2: 2.20, 3: 2.25}  # relu2's final loss per seed, at both widths
# (optimizer, activation, width) -> the gap to relu2 on seeds 1, 2, 3
GAPS = {
    ("adamw", "xielu", 64): (-0.05, -0.04, -0.06),
    ("adamw", "xielu", 128): (-0.02, 0.01, -0.03),
    ("ademamix", "xielu", 64): (0.03, 0.04, 0.02),
    ("ademamix", "xielu", 128): (0.01, -0.01, 0.03),
    ("muon", "xielu", 64): (-0.02, -0.03, -0.025),
    ("muon", "xielu", 128): (-0.02, -0.03, -0.04),
    **{(o, "swiglu", w): (-0.10, -0.11, -0.12) for o in OPTIMIZERS for w in (64, 128)},
}


def _ladder(tmp_path):
    runs = []
    for optimizer, (settings, selection) in OPTIMIZERS.items():
        rate = min(selection, key=selection.get)

        def run(activation, width, seed, final, at=rate, settings=settings, optimizer=optimizer):
            if optimizer == "muon":  # Muon's rate is optim.muon.lr; its AdamW part keeps lr
                return fake_run(
                    tmp_path,
                    activation,
                    "mup",
                    width,
                    3e-3,
                    seed,
                    final,
                    optim={**settings, "muon": {"lr": at}},
                )
            return fake_run(tmp_path, activation, "mup", width, at, seed, final, optim=settings)

        for activation in ("relu2", "swiglu", "xielu"):
            for tried, loss in selection.items():
                runs.append(run(activation, 64, 0, loss, at=tried))
            for width in (64, 128):
                for seed, base in BASELINE.items():
                    gap = (
                        0.0
                        if activation == "relu2"
                        else GAPS[(optimizer, activation, width)][seed - 1]
                    )
                    runs.append(run(activation, width, seed, base + gap))
        other = max(selection, key=selection.get)  # a seed at the rate not chosen: left out
        runs.append(run("xielu", 64, 1, 9.9, at=other))
    return [read_run(r) for r in runs]


def _interval(diffs):
    mean = statistics.fmean(diffs)
    half = T975_2 * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


@pytest.mark.slow  # reads 72 run directories
def test_each_optimizer_is_read_at_its_own_rate_and_the_gaps_are_paired_by_seed(tmp_path):
    report = optimizer_report.by_optimizer(_ladder(tmp_path), 64, 0, "relu2")
    assert {o: part["rates"]["xielu"] for o, part in report.items()} == {
        "adamw": 6e-3,
        "ademamix": 1.5e-3,
        "muon": 0.04,
    }
    assert report["muon"]["setting"] == "optim.muon.lr"
    assert report["muon"]["lrs"]["xielu"] == 3e-3 and report["adamw"]["lrs"] == {}
    assert "| xielu | 0.006 | 0.0015 | 0.04 (optim.lr 0.003) |" in optimizer_report.tables(
        report, "relu2"
    )
    assert report["adamw"]["setting"] == "optim.lr"
    for (optimizer, activation, width), diffs in GAPS.items():
        (row,) = [
            r
            for r in report[optimizer]["rows"]
            if (r["activation"], r["width"]) == (activation, width)
        ]
        mean, low, high = _interval(diffs)
        assert row["seeds"] == 3  # the decoy at the other rate is not a fourth seed
        assert (row["diff"], row["diff_low"], row["diff_high"]) == pytest.approx((mean, low, high))


@pytest.mark.slow
def test_the_verdict_says_whether_the_sign_holds_under_every_optimizer(tmp_path):
    report = optimizer_report.by_optimizer(_ladder(tmp_path), 64, 0, "relu2")
    verdicts = optimizer_report.verdicts(report, "relu2")
    names = {"adamw": "AdamW", "ademamix": "AdEMAMix", "muon": "Muon"}

    def rule(diffs):  # written out: a side only where the 95% interval excludes 0
        _, low, high = _interval(diffs)
        return "ahead" if high < 0 else "behind" if low > 0 else "not resolved at 3 seeds"

    cells = {}
    for (o, a, w), d in sorted(GAPS.items()):
        if a == "xielu":
            cells.setdefault(rule(d), []).append(f"{names[o]} {w}")
    # the means alone would call AdamW 128 and AdEMAMix 128 ahead and behind
    assert sorted(cells) == ["ahead", "behind", "not resolved at 3 seeds"]
    expected = "the sign does not hold: " + "; ".join(
        f"{verdict} at {', '.join(where)}" for verdict, where in sorted(cells.items())
    )
    assert verdicts["xielu"] == expected
    assert verdicts["swiglu"] == (
        "ahead of relu2 under all 3 optimizers at every width: the sign holds"
    )
    text = "\n".join(optimizer_report.tables(report, "relu2"))
    assert (
        "| relu2 | 64 | 2.2500 ± 0.0500 (3) | 2.2500 ± 0.0500 (3) | 2.2500 ± 0.0500 (3) |" in text
    )


@pytest.mark.slow
def test_the_per_run_table_holds_every_run_and_the_report_reads_it_back(tmp_path):
    (tmp_path / "runs").mkdir()
    runs = _ladder(tmp_path / "runs")
    out = tmp_path / "report" / "optimizers.md"
    assert optimizer_report.main([*(str(r.path) for r in runs), "--out", str(out)]) == 0
    table = list(csv.DictReader((out.parent / "optimizers_runs.csv").open()))
    assert len(table) == len(runs)
    (row,) = [
        r
        for r in table
        if (r["optimizer"], r["activation"], r["width"], r["seed"]) == ("muon", "xielu", "128", "2")
    ]
    assert float(row["rate"]) == 0.04  # optim.muon.lr, the rate Muon's sweeps vary
    assert float(row["final"]) == pytest.approx(BASELINE[2] + GAPS[("muon", "xielu", 128)][1])
    again = tmp_path / "again" / "optimizers.md"
    csv_path = out.parent / "optimizers_runs.csv"
    assert optimizer_report.main([str(csv_path), "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()


@pytest.mark.slow
def test_a_second_stage_read_alone_takes_the_one_rate_each_pair_trained_at(tmp_path):
    """Without the selection seed's runs, a pair trained at one rate is read at it (its sweep
    fixed it); a pair trained at two is left without a rate rather than guessed."""
    runs = [r for r in _ladder(tmp_path) if r.seed != 0]
    report = optimizer_report.by_optimizer(runs, 64, 0, "relu2")
    assert report["adamw"]["rates"]["swiglu"] == 6e-3 and report["muon"]["rates"]["relu2"] == 0.04
    assert "xielu" not in report["adamw"]["rates"]  # the decoy's other rate: two rates
    (tmp_path / "full").mkdir()
    full = optimizer_report.by_optimizer(_ladder(tmp_path / "full"), 64, 0, "relu2")
    for optimizer in ("adamw", "muon"):
        rows = {(r["activation"], r["width"]): r for r in report[optimizer]["rows"]}
        for row in full[optimizer]["rows"]:
            if row["activation"] != "xielu":
                assert rows[row["activation"], row["width"]] == row


def test_muon_runs_at_one_rate_with_two_adamw_rates_are_refused(tmp_path):
    """Two stages at one Muon rate but two AdamW-part rates are not one arm's seeds."""
    runs = [
        fake_run(
            tmp_path,
            "xielu",
            "mup",
            64,
            lr,
            seed,
            2.0,
            optim={"name": "muon", "muon": {"lr": 0.04}},
        )
        for lr, seed in ((3e-3, 1), (6e-3, 2))
    ]
    with pytest.raises(SystemExit, match=r"optim\.lr 0\.003, 0\.006: pass the runs of one pair"):
        optimizer_report.by_optimizer([read_run(r) for r in runs], 64, 0, "relu2")
