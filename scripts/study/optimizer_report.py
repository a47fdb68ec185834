"""Does an activation's gap to the baseline keep its sign across optimizers?

    python -m scripts.study.optimizer_report runs/opt_adamw-* runs/opt_ademamix-* runs/opt_muon-*

The runs of each optimizer (``optim.name``) are read as ``scripts.study.width_report`` reads a
µP ladder: each activation at the rate it did best with on the selection seed at the base width
(``optim.lr``, or ``optim.muon.lr`` under Muon: ``OptimConfig.tuned_rate``), the other seeds at
that rate, the gap to the baseline paired by seed with Student's 95% interval. Where the runs
hold no selection-seed run of a pair but train it at one rate (a second stage read on its own,
or its ``_runs.csv``), that rate is the pair's. The tables put the
optimizers side by side (the rates, the gap at each width, its trend with width), and the last
says for each activation whether the sign holds: by ``eval.comparison``'s one rule, only where
every cell (an optimizer at a width) is resolved the same way, ahead or behind; each cell that is
not resolved is named with its seeds.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from eval.comparison import resolved, sign_holds
from eval.runs import Run, chosen_rates, rate_setting, read_runs, write_page
from scripts.common import markdown
from scripts.study.width_report import gap_trends, ladder_rows

NAMES = {"adamw": "AdamW", "ademamix": "AdEMAMix", "muon": "Muon"}


def by_optimizer(runs: list[Run], base: int, selection_seed: int, baseline: str) -> dict[str, dict]:
    """optimizer -> its rates (activation -> rate), the setting they are values of, and its
    ladder rows (``width_report.ladder_rows``)."""
    groups = defaultdict(list)
    for r in runs:
        groups[r.optimizer].append(r)
    out = {}
    for optimizer, group in sorted(groups.items()):
        rates = chosen_rates(group, base, selection_seed)
        setting = rate_setting(group)
        out[optimizer] = {
            "setting": setting,
            "rates": rates,
            "lrs": {} if setting == "optim.lr" else _rest_rates(group, rates),
            "rows": ladder_rows(group, rates, selection_seed, baseline),
        }
    return out


def _rest_rates(runs: list[Run], rates: dict[str, float]) -> dict[str, float]:
    """activation -> the ``optim.lr`` of its runs at its chosen rate, under an optimizer whose
    rate is another setting (Muon's AdamW part). Runs at that rate with two are refused: their
    seeds would be paired as one arm's."""
    lrs = {}
    for activation, rate in rates.items():
        trained = sorted({r.lr for r in runs if r.activation == activation and r.rate == rate})
        if len(trained) > 1:
            raise SystemExit(
                f"{activation}'s runs at {runs[0].optimizer} rate {rate:g} have optim.lr "
                f"{', '.join(f'{lr:g}' for lr in trained)}: pass the runs of one pair"
            )
        lrs[activation] = trained[0]
    return lrs


def why_empty(
    runs: list[Run], report: dict[str, dict], base: int, selection_seed: int, baseline: str
) -> str | None:
    """Why the tables would be empty (no rate chosen, no gap to the baseline), naming the
    flags and what the runs hold; None when they are not."""
    widths = ", ".join(map(str, sorted({r.width for r in runs})))
    seeds = ", ".join(map(str, sorted({r.seed for r in runs})))
    if not any(part["rates"] for part in report.values()):
        return (
            f"no finished run at --base {base} with --selection-seed {selection_seed} to choose "
            f"the rates from: the runs have widths {widths} and seeds {seeds}"
        )
    if not any("diff" in row for part in report.values() for row in part["rows"]):
        activations = ", ".join(sorted({r.activation for r in runs}))
        return (
            f"no gap to --baseline {baseline}: no run of it pairs with another's seed at its "
            f"chosen rate; the runs' activations are {activations}, their seeds {seeds}"
        )
    return None


def _loss(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["seeds"] < 2:
        return f"{row['final_mean']:.4f} (1)"
    return f"{row['final_mean']:.4f} ± {row['final_std']:.4f} ({row['seeds']})"


def _gap(row: dict | None) -> str:
    if row is None or "diff" not in row:
        return "-"
    star = "**" if resolved(row["verdict"]) else ""
    return f"{star}{row['diff']:+.4f}{star} [{row['diff_low']:+.4f}, {row['diff_high']:+.4f}]"


def _where(pairs: list[tuple[str, int]]) -> str:
    return ", ".join(f"{NAMES.get(o, o)} {w}" for o, w in pairs)


def verdicts(report: dict[str, dict], baseline: str) -> dict[str, str]:
    """activation -> whether its gap to the baseline holds its sign under every optimizer at
    every width (``eval.comparison.sign_holds``), and otherwise each cell's verdict."""
    cells = defaultdict(list)  # activation -> [(optimizer, width, verdict)]
    for optimizer, part in report.items():
        for row in part["rows"]:
            if "diff" in row:
                cells[row["activation"]].append((optimizer, row["width"], row["verdict"]))
    out = {}
    for activation, points in sorted(cells.items()):
        holds = sign_holds([v for _, _, v in points])
        optimizers = len({o for o, _, _ in points})
        if holds:
            under = f"all {optimizers} optimizers" if optimizers > 1 else "its one optimizer"
            out[activation] = f"{holds} of {baseline} under {under} at every width: the sign holds"
            continue
        by_verdict = defaultdict(list)
        for o, w, v in points:
            by_verdict[v].append((o, w))
        out[activation] = "the sign does not hold: " + "; ".join(
            f"{v} at {_where(where)}" for v, where in sorted(by_verdict.items())
        )
    return out


def tables(report: dict[str, dict], baseline: str) -> list[str]:
    optimizers = list(report)
    names = [NAMES.get(o, o) for o in optimizers]
    activations = sorted({a for part in report.values() for a in part["rates"]})

    def rate(optimizer: str, activation: str) -> str:
        part = report[optimizer]
        text = f"{part['rates'].get(activation, float('nan')):g}"
        lr = part["lrs"].get(activation)
        return text if lr is None else f"{text} (optim.lr {lr:g})"

    rates = [[a, *(rate(o, a) for o in optimizers)] for a in activations]
    settings = [f"{n} ({report[o]['setting']})" for n, o in zip(names, optimizers, strict=True)]
    lines = [
        "## Rates (the selection seed, the base width)",
        *markdown(["activation", *settings], rates),
    ]

    rows = {(o, r["activation"], r["width"]): r for o in optimizers for r in report[o]["rows"]}
    widths = sorted({w for _, _, w in rows})
    losses, gaps = [], []
    for width in widths:
        for a in activations:
            cells = [rows.get((o, a, width)) for o in optimizers]
            losses.append([a, str(width), *(_loss(r) for r in cells)])
            if a != baseline:
                gaps.append([a, str(width), *(_gap(r) for r in cells)])
    lines += ["", "## Final validation loss, mean ± std over seeds (seeds)"]
    lines += markdown(["activation", "width", *names], losses)
    lines += ["", f"## final - {baseline}, paired by seed [95% CI] (bold: the interval excludes 0)"]
    lines += markdown(["activation", "width", *names], gaps)

    trends = {o: gap_trends(report[o]["rows"]) for o in optimizers}
    if any(trends.values()):
        body = []
        for a in activations:
            cells = []
            for o in optimizers:
                t = trends[o].get(a)
                if t is None:
                    cells.append("-")
                    continue
                star = "**" if t.high < 0 or t.low > 0 else ""  # the interval excludes 0
                cells.append(f"{star}{t.slope:+.4f}{star} [{t.low:+.4f}, {t.high:+.4f}]")
            if any(c != "-" for c in cells):
                body.append([a, *cells])
        lines += ["", "## Change of the gap per doubling of width [95% CI] (bold: excludes 0)"]
        lines += markdown(["activation", *names], body)

    lines += ["", "## Does the sign of the gap hold across optimizers?"]
    lines += markdown(
        ["activation", "verdict"], [[a, v] for a, v in verdicts(report, baseline).items()]
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs",
        nargs="+",
        help="run directories of one or more optimizers, or the _runs.csv it wrote",
    )
    parser.add_argument("--base", type=int, default=64, help="µP's base width (model.mup_base_dim)")
    parser.add_argument("--baseline", default="relu2")
    parser.add_argument("--selection-seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        help="write the tables to this markdown file, and its runs to <name>_runs.csv beside it",
    )
    args = parser.parse_args(argv)
    runs = read_runs(args.runs)
    report = by_optimizer(runs, args.base, args.selection_seed, args.baseline)
    why = why_empty(runs, report, args.base, args.selection_seed, args.baseline)
    if why and not any(part["rates"] for part in report.values()):
        raise SystemExit(why)  # nothing to show
    if why:
        print(why, file=sys.stderr)  # the rates stand; the gaps cannot be read
    lines = tables(report, args.baseline)
    print("\n".join(lines))
    if args.out:
        write_page(lines, runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
