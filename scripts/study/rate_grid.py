"""Two rates tuned together: each activation's final loss over a grid of its optimizer's own rate
and ``optim.lr``.

    python -m scripts.study.rate_grid runs/opt_muon_adamw-* --out docs/optimizers/muon_rates.md

Muon (and NorMuon) train the hidden matrices at their own rate (``optim.muon.lr``:
``OptimConfig.tuned_rate``) and everything else, the embedding, the head, the norms and the
activation's scalars, with AdamW at ``optim.lr``. A one-dimensional search holds one of the two
fixed; this report reads a grid of both on the selection seed at one width: per activation the
final validation loss at every pair (rows ``optim.lr``, columns the optimizer's rate), the best
in bold, and the best pair with the axes along which it sits at the grid's edge (where the grid
should grow before the pair is trusted). ``--out`` writes the tables and the runs they read
(``<name>_runs.csv`` beside them, which the report also reads in place of the directories).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval.runs import Run, rate_setting, read_runs, write_page
from scripts.common import markdown


def grid(runs: list[Run], selection_seed: int) -> dict[str, dict[tuple[float, float], float]]:
    """activation -> {(optim.lr, the optimizer's rate): final loss} of the finished runs on the
    selection seed (a diverged run's loss is infinite, so that it loses to every finished one).
    Runs of several widths are refused: a pair is tuned at one."""
    chosen = [r for r in runs if r.seed == selection_seed and (r.final is not None or r.diverged)]
    widths = sorted({r.width for r in chosen})
    if len(widths) > 1:
        raise SystemExit(
            f"these runs have widths {', '.join(map(str, widths))}: a rate pair is tuned at one "
            "width; pass one width's runs"
        )
    out: dict[str, dict[tuple[float, float], float]] = {}
    for r in chosen:
        loss = float("inf") if r.diverged or r.final is None else r.final
        cell = out.setdefault(r.activation, {})
        if (r.lr, r.rate) in cell:
            raise SystemExit(f"two runs of {r.activation} at optim.lr {r.lr:g}, rate {r.rate:g}")
        cell[(r.lr, r.rate)] = loss
    return out


def best_pair(
    losses: dict[tuple[float, float], float], setting: str
) -> tuple[tuple[float, float], list[str]]:
    """The pair with the lowest loss, and the axes (``optim.lr``, ``setting``) along which it
    is the smallest or largest value tried."""
    pair = min(losses, key=losses.get)
    edges = []
    for axis, name in ((0, "optim.lr"), (1, setting)):
        tried = sorted({p[axis] for p in losses})
        if len(tried) > 1 and pair[axis] in (tried[0], tried[-1]):
            edges.append(name)
    return pair, edges


def tables(losses: dict[str, dict[tuple[float, float], float]], setting: str) -> list[str]:
    summary = []
    for activation, cell in sorted(losses.items()):
        (lr, rate), edges = best_pair(cell, setting)
        row = [activation, f"{lr:g}", f"{rate:g}", f"{cell[(lr, rate)]:.4f}", ", ".join(edges)]
        summary.append(row if edges else [*row[:-1], "-"])
    lines = ["## Best pair (the selection seed)"]
    lines += markdown(
        ["activation", "optim.lr", setting, "final loss", "at the grid's edge along"], summary
    )
    for activation, cell in sorted(losses.items()):
        best = min(cell, key=cell.get)
        rates = sorted({p[1] for p in cell})
        body = []
        for lr in sorted({p[0] for p in cell}):
            row = [f"{lr:g}"]
            for rate in rates:
                loss = cell.get((lr, rate))
                text = "-" if loss is None else f"{loss:.4f}"
                row.append(f"**{text}**" if (lr, rate) == best else text)
            body.append(row)
        lines += ["", f"## {activation}: final loss, optim.lr (rows) x {setting} (columns)"]
        lines += markdown(["optim.lr", *(f"{r:g}" for r in rates)], body)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", help="run directories of one optimizer, or the _runs.csv it wrote"
    )
    parser.add_argument("--selection-seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, help="write the tables here, and the runs to <name>_runs.csv beside it"
    )
    args = parser.parse_args(argv)
    runs = read_runs(args.runs)
    setting = rate_setting(runs)
    losses = grid(runs, args.selection_seed)
    if not losses:
        raise SystemExit(f"no finished run on --selection-seed {args.selection_seed}")
    lines = tables(losses, setting)
    print("\n".join(lines))
    if args.out:
        write_page(lines, runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
