"""The two-rate grid report (``scripts/study/rate_grid.py``): the best pair is the argmin of a
loss surface written out here, its edges are the axes where it is the first or last value tried,
and the per-run table it writes reads back into the same page."""

import math
from pathlib import Path

import pytest
from test_width_report import fake_run

from eval.runs import Run, read_run, read_runs
from scripts.study import rate_grid

LRS = (1.5e-3, 3e-3, 6e-3, 1.2e-2)
MUON_LRS = (0.02, 0.04, 0.08)


def bowl(lr: float, rate: float, best_lr: float, best_rate: float) -> float:
    """A loss with its minimum at (best_lr, best_rate), quadratic in log2 of each rate."""
    return 2.0 + 0.01 * math.log2(lr / best_lr) ** 2 + 0.02 * math.log2(rate / best_rate) ** 2


def run(activation, lr, rate, final, seed=0, width=64, diverged=False) -> Run:
    return Run(
        path=Path(f"opt_muon_adamw-{activation}_lr-{lr}_muon_lr-{rate}_seed-{seed}"),
        activation=activation,
        init="mup",
        width=width,
        optimizer="muon",
        rate=rate,
        lr=lr,
        seed=seed,
        params=1,
        tokens_per_step=1,
        val={} if final is None else {200: final},
        steps=200,
        stable_end=None,
        diverged=diverged,
    )


def surface(best: dict[str, tuple[float, float]]) -> list[Run]:
    runs = [
        run(a, lr, rate, bowl(lr, rate, *where))
        for a, where in best.items()
        for lr in LRS
        for rate in MUON_LRS
    ]
    runs.append(run("xielu", 3e-3, 0.04, 1.0, seed=1))  # another seed: not the selection's
    return runs


def test_the_best_pair_is_the_argmin_and_its_edges_are_named():
    best = {"xielu": (6e-3, 0.04), "relu2": (1.2e-2, 0.04), "xiprelu": (1.5e-3, 0.08)}
    losses = rate_grid.grid(surface(best), selection_seed=0)
    assert set(losses) == set(best)
    for activation, where in best.items():
        assert len(losses[activation]) == len(LRS) * len(MUON_LRS)
        pair, edges = rate_grid.best_pair(losses[activation], "optim.muon.lr")
        assert pair == where
        expected = [
            name
            for value, tried, name in (
                (where[0], LRS, "optim.lr"),
                (where[1], MUON_LRS, "optim.muon.lr"),
            )
            if value in (min(tried), max(tried))
        ]
        assert edges == expected
    lines = rate_grid.tables(losses, "optim.muon.lr")
    assert "| xielu | 0.006 | 0.04 | 2.0000 | - |" in lines
    assert "| xiprelu | 0.0015 | 0.08 | 2.0000 | optim.lr, optim.muon.lr |" in lines
    # xielu's grid: the row at optim.lr 0.006 has the bold minimum in the 0.04 column
    assert f"| 0.006 | {bowl(6e-3, 0.02, *best['xielu']):.4f} | **2.0000** |" in "\n".join(lines)


def test_a_diverged_run_loses_to_every_finished_one():
    runs = [run("relu2", 3e-3, 0.04, None, diverged=True), run("relu2", 3e-3, 0.02, 9.0)]
    pair, _ = rate_grid.best_pair(rate_grid.grid(runs, 0)["relu2"], "optim.muon.lr")
    assert pair == (3e-3, 0.02)


def test_runs_of_two_widths_or_one_pair_twice_are_refused():
    with pytest.raises(SystemExit, match="widths 64, 128"):
        rate_grid.grid([run("relu2", 3e-3, 0.04, 2.0), run("relu2", 3e-3, 0.04, 2.0, width=128)], 0)
    with pytest.raises(SystemExit, match=r"two runs of relu2 at optim\.lr 0\.003, rate 0\.04"):
        rate_grid.grid([run("relu2", 3e-3, 0.04, 2.0), run("relu2", 3e-3, 0.04, 2.1)], 0)


def test_muons_two_rates_are_read_from_the_run_directory(tmp_path):
    path = fake_run(
        tmp_path, "xielu", "mup", 64, 6e-3, 0, 2.1, optim={"name": "muon", "muon": {"lr": 0.04}}
    )
    r = read_run(path)
    assert (r.lr, r.rate, r.optimizer) == (6e-3, 0.04, "muon")


def test_the_page_reads_back_from_the_runs_it_wrote(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    paths = [
        fake_run(
            runs_dir,
            a,
            "mup",
            64,
            lr,
            0,
            bowl(lr, rate, 6e-3, 0.04) + shift,
            optim={"name": "muon", "muon": {"lr": rate}},
        )
        for a, shift in (("relu2", 0.0), ("xielu", 0.1))
        for lr in LRS[:2]
        for rate in MUON_LRS[:2]
    ]
    out = tmp_path / "docs" / "muon_rates.md"
    assert rate_grid.main([*map(str, paths), "--out", str(out)]) == 0
    page = out.read_text()
    table = out.with_name("muon_rates_runs.csv")
    assert len(read_runs([table])) == len(paths)
    again = tmp_path / "again.md"
    assert rate_grid.main([str(table), "--out", str(again)]) == 0
    assert again.read_text() == page
