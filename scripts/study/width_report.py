"""The width study's report: does the best learning rate move with width, and does an
activation's gap to the baseline shrink, hold or grow along a µP width ladder?

    python -m scripts.study.width_report runs/width-* --out docs/width   # tables, CSV, figures

Two stages, as in ``scripts.study.study_report``, so that no reported number is one a rate was
picked on (``configs/experiment/width.yaml``):

1. **Rates** (``configs/sweep/width_lr.yaml``, the selection seed 0): final validation loss
   against ``optim.lr`` per parametrization, activation and width. Under µP the best rate at
   every width should be the base width's (within the grid's factor of 2); under the standard
   parametrization it moves.
2. **Ladder** (``configs/sweep/width_ladder.yaml``: µP, the other seeds, each activation at the
   rate it did best with *at the base width*, ``eval/tuning.py``): final loss per
   activation and width, a power law ``loss = a N^-b`` per activation over non-embedding
   parameters N, and each activation's gap to the baseline at each width, paired by seed, with
   Student's 95% interval.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from eval.comparison import Trend, paired_difference, power_law_fit, spread, trend, verdict
from eval.runs import Run, chosen_rates, rate_setting, read_runs, write_runs_csv
from scripts.common import markdown, write_csv
from scripts.figures import pyplot, save


def _rates(runs: list[Run], selection_seed: int) -> dict[tuple[str, str, int], dict[float, float]]:
    """(parametrization, activation, width) -> {lr: final loss} on the selection seed; a
    diverged run (no finite final loss) counts as infinitely bad."""
    out = defaultdict(dict)
    for r in runs:
        if r.seed != selection_seed or (r.final is None and not r.diverged):
            continue  # still running
        ok = not r.diverged and r.final is not None and math.isfinite(r.final)
        out[(_parametrization(r), r.activation, r.width)][r.rate] = r.final if ok else math.inf
    return out


def _parametrization(run: Run) -> str:
    """``mup``, or ``standard`` (at a fixed std; ``standard, width init`` with the width rule)."""
    return {"fixed": "standard", "width": "standard, width init"}.get(run.init, run.init)


def rate_rows(runs: list[Run], selection_seed: int, base: int) -> list[dict]:
    """Per parametrization, activation and width: the loss at each rate, the best rate, and
    the best rate over the base width's (1 = the rate transferred)."""
    by_arm = _rates(runs, selection_seed)
    rows = []
    for (init, activation, width), losses in sorted(by_arm.items()):
        best = min(losses, key=losses.get)
        at_base = by_arm.get((init, activation, base))
        rows.append(
            {
                "parametrization": init,
                "activation": activation,
                "width": width,
                "losses": dict(sorted(losses.items())),
                "best_lr": best,
                "best_at_edge": len(losses) > 1 and best in (min(losses), max(losses)),
                "shift_from_base": best / min(at_base, key=at_base.get) if at_base else None,
            }
        )
    return rows


def rate_table(rows: list[dict]) -> list[str]:
    rates = sorted({lr for r in rows for lr in r["losses"]})
    header = ["parametrization", "activation", "width", *(f"{lr:g}" for lr in rates)]
    header += ["best rate", "best / base's"]
    body = []
    for r in rows:
        cells = []
        for lr in rates:
            loss = r["losses"].get(lr)
            text = "-" if loss is None else ("diverged" if loss == math.inf else f"{loss:.3f}")
            cells.append(f"**{text}**" if lr == r["best_lr"] else text)
        shift = r["shift_from_base"]
        edge = " (edge)" if r["best_at_edge"] else ""
        body.append(
            [
                r["parametrization"],
                r["activation"],
                str(r["width"]),
                *cells,
                f"{r['best_lr']:g}{edge}",
                "-" if shift is None else f"x{shift:g}",
            ]
        )
    return markdown(header, body)


def ladder_rows(
    runs: list[Run], rates: dict[str, float], selection_seed: int, baseline: str
) -> list[dict]:
    """Per activation and width under µP, at the activation's base rate and on every seed but
    the selection seed: the final loss over seeds and the gap to ``baseline``, paired by seed."""
    chosen = defaultdict(dict)
    for r in runs:
        at_rate = rates.get(r.activation) == r.rate
        if r.init == "mup" and r.seed != selection_seed and r.final is not None and at_rate:
            chosen[(r.activation, r.width)][r.seed] = r
    rows = []
    for (activation, width), by_seed in sorted(chosen.items()):
        summary = spread([r.final for r in by_seed.values()])
        row = {
            "activation": activation,
            "width": width,
            "params": next(iter(by_seed.values())).params,
            "lr": rates[activation],
            "seeds": summary.n,
            "final_mean": summary.mean,
            "final_std": summary.std,
        }
        base = chosen.get((baseline, width))
        if activation != baseline and base and set(base) & set(by_seed):
            diff = paired_difference(
                {s: r.final for s, r in by_seed.items()}, {s: r.final for s, r in base.items()}
            )
            row |= {"diff": diff.mean, "diff_low": diff.low, "diff_high": diff.high}
            row["diffs"] = [
                by_seed[s].final - base[s].final for s in sorted(set(base) & set(by_seed))
            ]
            row["verdict"] = verdict(diff)
        rows.append(row)
    return rows


def fits(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """activation -> (a, b) of ``loss = a N^-b`` over its widths (three or more)."""
    points = defaultdict(list)
    for r in rows:
        points[r["activation"]].append((r["params"], r["final_mean"]))
    return {
        activation: power_law_fit([n for n, _ in p], [loss for _, loss in p])
        for activation, p in points.items()
        if len(p) >= 3
    }


def ladder_table(rows: list[dict], baseline: str) -> list[str]:
    header = ["activation", "width", "params", "rate", "seeds", "final loss"]
    header += [f"final - {baseline} [95% CI]", "verdict"]
    body = []
    for r in sorted(rows, key=lambda r: (r["width"], r["activation"])):
        diff = "-"
        if "diff" in r:
            diff = f"{r['diff']:+.4f} [{r['diff_low']:+.4f}, {r['diff_high']:+.4f}]"
        body.append(
            [
                r["activation"],
                str(r["width"]),
                f"{r['params'] / 1e6:.2f}M",
                f"{r['lr']:g}",
                str(r["seeds"]),
                f"{r['final_mean']:.3f} ± {r['final_std']:.3f}",
                diff,
                r.get("verdict", "baseline" if r["activation"] == baseline else "-"),
            ]
        )
    return markdown(header, body)


def gap_trends(rows: list[dict]) -> dict[str, Trend]:
    """activation -> how its per-seed gap to the baseline moves per doubling of width, over
    every width and seed of the ladder (two or more widths)."""
    points = defaultdict(list)
    for r in rows:
        points[r["activation"]] += [(math.log2(r["width"]), d) for d in r.get("diffs", [])]
    return {
        activation: trend([x for x, _ in p], [d for _, d in p])
        for activation, p in points.items()
        if len({x for x, _ in p}) >= 2 and len(p) >= 3
    }


def trend_table(trends: dict[str, Trend], baseline: str) -> list[str]:
    body = [
        [
            a,
            f"{t.slope:+.4f} [{t.low:+.4f}, {t.high:+.4f}]",
            str(t.n),
            "no trend resolved"
            if t.flat
            else (f"rises: loses to {baseline}" if t.low > 0 else f"falls: gains on {baseline}"),
        ]
        for a, t in sorted(trends.items())
    ]
    header = [
        "activation",
        f"change of (final - {baseline}) per doubling of width [95% CI]",
        "points",
        "with width, the gap",
    ]
    return markdown(header, body)


def fit_table(power_laws: dict[str, tuple[float, float]]) -> list[str]:
    body = [[a, f"{c:.3f}", f"{b:.4f}"] for a, (c, b) in sorted(power_laws.items())]
    return markdown(["activation", "a", "b (loss = a N^-b)"], body)


# ---------------------------------------------------------------------------------- figures
def plot_rates(rows: list[dict], out: Path, setting: str = "optim.lr") -> Path:
    """Final loss against the rate: a panel per activation and parametrization, a line per
    width; the best rate of each line marked."""
    plt = pyplot()
    activations = sorted({r["activation"] for r in rows})
    inits = sorted({r["parametrization"] for r in rows})
    rates = sorted({lr for r in rows for lr in r["losses"]})
    fig, axes = plt.subplots(
        len(activations),
        len(inits),
        figsize=(5 * len(inits), 3.6 * len(activations)),
        squeeze=False,
        sharey="row",
    )
    for i, activation in enumerate(activations):
        for j, init in enumerate(inits):
            ax = axes[i][j]
            for r in rows:
                if (r["activation"], r["parametrization"]) != (activation, init):
                    continue
                finite = {lr: v for lr, v in r["losses"].items() if v != math.inf}
                line = ax.plot(
                    list(finite), list(finite.values()), "o-", label=f"width {r['width']}"
                )
                if r["best_lr"] in finite:
                    ax.plot(
                        [r["best_lr"]],
                        [finite[r["best_lr"]]],
                        "*",
                        ms=14,
                        color=line[0].get_color(),
                    )
            if not ax.lines:  # e.g. an activation tuned under µP only
                ax.axis("off")
                continue
            ax.set_xscale("log")
            ax.set_xticks(rates, [f"{lr:g}" for lr in rates], fontsize=7)
            ax.minorticks_off()
            ax.set_title(f"{activation}, {init}")
            ax.set_xlabel(setting)
            ax.set_ylabel("final validation loss (seed 0)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, out)


def plot_ladder(rows: list[dict], power_laws: dict, baseline: str, out: Path) -> Path:
    """Left: final loss against parameters, a fitted power law per activation. Right: each
    activation minus the baseline against width, with the 95% interval."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, activation in enumerate(sorted({r["activation"] for r in rows})):
        color = cycle[k % len(cycle)]
        mine = sorted((r for r in rows if r["activation"] == activation), key=lambda r: r["width"])
        params = [r["params"] for r in mine]
        left.errorbar(
            params,
            [r["final_mean"] for r in mine],
            yerr=[r["final_std"] for r in mine],
            fmt="o",
            color=color,
            capsize=3,
        )
        if activation in power_laws:
            a, b = power_laws[activation]
            xs = [params[0] * (params[-1] / params[0]) ** (i / 50) for i in range(51)]
            left.plot(
                xs,
                [a * x**-b for x in xs],
                color=color,
                lw=1,
                label=f"{activation}: {a:.2f} N^-{b:.3f}",
            )
        gaps = [r for r in mine if "diff" in r]
        if gaps:
            widths = [r["width"] * (1 + 0.03 * (k - 1.5)) for r in gaps]  # side by side
            right.errorbar(
                widths,
                [r["diff"] for r in gaps],
                yerr=[
                    [r["diff"] - r["diff_low"] for r in gaps],
                    [r["diff_high"] - r["diff"] for r in gaps],
                ],
                fmt="o-",
                color=color,
                capsize=3,
                label=activation,
            )
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("parameters without the embedding")
    left.set_ylabel("final validation loss (mean ± std over seeds)")
    left.legend(fontsize=7)
    right.axhline(0, color="black", lw=0.8)
    right.set_xscale("log", base=2)
    right.set_xlabel("width (dim)")
    right.set_ylabel(f"final loss minus {baseline}, paired by seed [95% CI]")
    right.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, out)


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="run directories, or the width_runs.csv it wrote")
    parser.add_argument("--base", type=int, default=64, help="µP's base width (model.mup_base_dim)")
    parser.add_argument("--baseline", default="relu2")
    parser.add_argument(
        "--baseline-lr",
        type=float,
        help="the baseline at this rate, not its base-width best (a robustness check)",
    )
    parser.add_argument(
        "--rates",
        nargs="+",
        metavar="ACTIVATION=LR",
        help="the rates to read each activation at (relu2=0.003 swiglu=0.006 ...), instead of "
        "the best on the selection seed or, with no selection run, the one rate it trained at",
    )
    parser.add_argument("--selection-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="directory for width.md, CSVs and figures")
    args = parser.parse_args(argv)
    runs = read_runs(args.runs)
    rows = rate_rows(runs, args.selection_seed, args.base)
    setting = rate_setting(runs)
    rates = chosen_rates(runs, args.base, args.selection_seed)
    if args.rates:
        rates = {name: float(lr) for name, lr in (item.split("=") for item in args.rates)}
    if args.baseline_lr is not None:
        rates[args.baseline] = args.baseline_lr
    ladder = ladder_rows(runs, rates, args.selection_seed, args.baseline)
    power_laws = fits(ladder)
    several_widths = len({r["width"] for r in ladder}) > 1  # else no trend nor ladder figure
    sections = []
    if rows:
        sections.append([f"## Rates (seed 0, {setting})", *rate_table(rows)])
    if ladder:
        sections.append(["## Ladder (µP)", *ladder_table(ladder, args.baseline)])
    if power_laws:  # an activation with three widths or more
        sections.append(["## Power laws", *fit_table(power_laws)])
    if several_widths:
        trends = trend_table(gap_trends(ladder), args.baseline)
        sections.append(["## The gap across widths", *trends])
    page = "\n\n".join("\n".join(section) for section in sections)
    print(page)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "width.md").write_text(page + "\n")
        write_runs_csv(runs, args.out / "width_runs.csv")
        if rows:  # a fixed-rate stage has no rate sweep to tabulate or draw
            losses = [
                {**r, "losses": " ".join(f"{k:g}:{v:.4f}" for k, v in r["losses"].items())}
                for r in rows
            ]
            write_csv(losses, args.out / "rates.csv")
            plot_rates(rows, args.out / "learning_rates.png", setting)
        if ladder:
            flat = [
                {**r, "diffs": " ".join(f"{d:.4f}" for d in r.get("diffs", []))} for r in ladder
            ]
            write_csv(flat, args.out / "ladder.csv")
        if several_widths:
            plot_ladder(ladder, power_laws, args.baseline, args.out / "ladder.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
