"""The comparison report of a study: best learning rate, spread over seeds, paired differences.

    python -m scripts.study.study_report runs/study-* --out docs/study  # table, CSV, figures
    python -m scripts.study.study_report runs/study-* --seeds-sweep configs/sweep/study_seeds.yaml

A run is one point of (activation, ``model.init_scaling``, width, ``optim.lr``, seed), read from
its ``config.yaml`` and ``metrics.jsonl``. Selection bias is avoided by design: each arm's
learning rate is the one with the lowest final validation loss on the *selection seed* (0: the
``study_lr`` sweep), and the reported numbers are those of the *other* seeds at that rate (the
``study_seeds`` sweep, which ``--seeds-sweep`` writes). Differences are paired by seed against
the baseline activation of the same initialisation and width and read by the one rule of
``eval.comparison.verdict``: ahead or behind only where the 95% interval excludes 0, otherwise
"not resolved at N seeds".
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from eval.comparison import paired_difference, power_law_fit, spread, verdict
from eval.runs import Run, rate_setting, read_runs, write_runs_csv
from scripts.common import markdown, write_csv
from scripts.figures import pyplot, save
from training.instruments.diagnostics import STATISTICS


def best_rates(runs: list[Run], selection_seed: int) -> dict[tuple, float]:
    """Per arm, the rate with the lowest final loss on the selection seed (an arm without a
    finished selection run keeps its only rate, if it has one)."""
    best = {}
    for arm in {r.arm for r in runs}:
        candidates = [r for r in runs if r.arm == arm and r.seed == selection_seed and r.final]
        if candidates:
            best[arm] = min(candidates, key=lambda r: r.final).rate
        elif len({r.rate for r in runs if r.arm == arm}) == 1:
            best[arm] = next(r.rate for r in runs if r.arm == arm)
    return best


def reported(runs: list[Run], best: dict, selection_seed: int) -> dict[tuple, list[Run]]:
    """Per arm, its finished runs at the chosen rate on every seed but the selection seed."""
    out = defaultdict(list)
    for r in runs:
        if r.arm in best and r.rate == best[r.arm] and r.seed != selection_seed and r.final:
            out[r.arm].append(r)
    return out


def comparison_rows(runs: list[Run], baseline: str, selection_seed: int = 0) -> list[dict]:
    best = best_rates(runs, selection_seed)
    chosen = reported(runs, best, selection_seed)
    rows = []
    for arm in sorted(best, key=lambda a: (a[1], a[2], a[0])):
        activation, init, width = arm
        seeds = chosen.get(arm, [])
        tried = sorted({r.rate for r in runs if r.arm == arm})
        row = {
            "activation": activation,
            "init_scaling": init,
            "width": width,
            "params": next(r.params for r in runs if r.arm == arm),
            "best_lr": best[arm],
            "lrs_tried": " ".join(f"{lr:g}" for lr in tried),
            "best_lr_at_edge": len(tried) > 1 and best[arm] in (tried[0], tried[-1]),
            "seeds": len(seeds),
        }
        for key in ("final", "stable"):
            values = [_loss(r, key) for r in seeds if _loss(r, key) is not None]
            if values:
                summary = spread(values)
                row[f"{key}_mean"], row[f"{key}_std"] = summary.mean, summary.std
        base = chosen.get((baseline, init, width), [])
        if activation != baseline and seeds and base:
            diff = paired_difference(
                {r.seed: r.final for r in seeds}, {r.seed: r.final for r in base}
            )
            row |= {"diff": diff.mean, "diff_low": diff.low, "diff_high": diff.high}
            row["verdict"] = verdict(diff)
        rows.append(row)
    return rows


def _loss(run: Run, key: str) -> float | None:
    return run.final if key == "final" else run.val.get(run.stable_end)


def _f(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.{digits}f}" if digits < 0 else f"{value:.{digits}f}"


def table(rows: list[dict], baseline: str) -> list[str]:
    header = [
        "activation",
        "init",
        "width",
        "best lr (of)",
        "seeds",
        "loss end of stable",
        "final loss",
        f"final - {baseline} [95% CI]",
        "verdict",
    ]
    body = []
    for r in rows:
        rate = f"{r['best_lr']:g}"
        if " " in r["lrs_tried"]:  # chosen among several rates: which, and whether at an edge
            rate += f"{' (edge)' if r['best_lr_at_edge'] else ''} ({r['lrs_tried']})"
        diff = "-"
        if "diff" in r:
            diff = f"{r['diff']:+.4f} [{r['diff_low']:+.4f}, {r['diff_high']:+.4f}]"
        body.append(
            [
                r["activation"],
                r["init_scaling"],
                str(r["width"]),
                rate,
                str(r["seeds"]),
                f"{_f(r.get('stable_mean'))} ± {_f(r.get('stable_std'))}",
                f"{_f(r.get('final_mean'))} ± {_f(r.get('final_std'))}",
                diff,
                r.get("verdict", "baseline" if r["activation"] == baseline else "-"),
            ]
        )
    return markdown(header, body)


def seeds_sweep(rows: list[dict], experiment: str, seeds: list[int]) -> str:
    """The second stage's sweep file: every arm at its chosen rate, on the reported seeds."""
    lines = [
        "# Written by python -m scripts.study.study_report --seeds-sweep: each arm at the "
        "learning rate",
        "# it did best with on the selection seed, trained again on other seeds.",
        "grids:",
    ]
    for r in rows:
        if r["init_scaling"] == "mup":
            raise ValueError(
                "a µP study takes its rates from the base width: "
                "python -m scripts.study.width_report --ladder-sweep writes its second stage"
            )
        lines += [
            f"  - overrides: [experiment={experiment}, model.init_scaling={r['init_scaling']},",
            f"                activation={r['activation']}, optim.lr={r['best_lr']:g}]",
            f"    sweep: {{trainer.seed: [{', '.join(map(str, seeds))}]}}",
        ]
    return "\n".join([*lines, "launcher: {}", ""])


# ---------------------------------------------------------------------------------- figures
def _colors(runs: list[Run]) -> dict[str, str]:
    names = sorted({r.activation for r in runs})
    cycle = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: cycle[i % len(cycle)] for i, name in enumerate(names)}


def plot_curves(runs: list[Run], best: dict, selection_seed: int, baseline: str, out: Path):
    """Validation loss against tokens (mean and min-max band over the reported seeds), and
    below it each activation minus the baseline, seed by seed."""
    chosen = reported(runs, best, selection_seed)
    inits = sorted({arm[1] for arm in chosen})
    plt = pyplot()
    fig, axes = plt.subplots(2, len(inits), figsize=(6 * len(inits), 7), squeeze=False)
    colors = _colors(runs)
    for col, init in enumerate(inits):
        for arm, group in sorted(chosen.items()):
            if arm[1] != init:
                continue
            steps = sorted(set.intersection(*(set(r.val) for r in group)))
            x = [s * group[0].tokens_per_step for s in steps]
            values = [[r.val[s] for r in group] for s in steps]
            color = colors[arm[0]]
            top, bottom = axes[0][col], axes[1][col]
            top.plot(x, [sum(v) / len(v) for v in values], color=color, label=arm[0])
            top.fill_between(
                x, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2
            )
            base = {r.seed: r for r in chosen.get((baseline, init, arm[2]), [])}
            pairs = [r for r in group if r.seed in base]
            if pairs and arm[0] != baseline:
                diffs = [
                    [r.val[s] - base[r.seed].val[s] for r in pairs]
                    for s in steps
                    if all(s in base[r.seed].val for r in pairs)
                ]
                xs = x[: len(diffs)]
                bottom.plot(xs, [sum(d) / len(d) for d in diffs], color=color, label=arm[0])
                bottom.fill_between(
                    xs, [min(d) for d in diffs], [max(d) for d in diffs], color=color, alpha=0.2
                )
        axes[0][col].set_title(f"model.init_scaling={init}")
        axes[0][col].set_ylabel("validation loss (nats/token)")
        axes[1][col].axhline(0, color="black", lw=0.8)
        axes[1][col].set_ylabel(f"minus {baseline}, same seed")
        axes[1][col].set_xlabel("tokens")
        axes[0][col].legend()
        # the start of training dwarfs the gaps: show the last two thirds
        last = [
            v
            for line in axes[0][col].get_lines()
            for v in line.get_ydata()[len(line.get_ydata()) // 3 :]
        ]
        if last:
            axes[0][col].set_ylim(min(last) - 0.02, max(last) + 0.02)
    fig.tight_layout()
    return save(fig, out)


def plot_rates(runs: list[Run], selection_seed: int, out: Path, setting: str = "optim.lr"):
    """Final validation loss against the learning rate, on the selection seed."""
    inits = sorted({r.init for r in runs})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(inits), figsize=(6 * len(inits), 4), squeeze=False)
    colors = _colors(runs)
    for col, init in enumerate(inits):
        ax = axes[0][col]
        for activation in sorted({r.activation for r in runs}):
            points = sorted(
                (r.rate, r.final)
                for r in runs
                if r.init == init
                and r.activation == activation
                and r.seed == selection_seed
                and r.final
            )
            if points:
                rates, losses = zip(*points, strict=True)
                ax.plot(rates, losses, "o-", color=colors[activation], label=activation)
        ax.set_xscale("log")
        ax.set_xlabel(setting)
        ax.set_ylabel(f"final validation loss (seed {selection_seed})")
        ax.set_title(f"model.init_scaling={init}")
        ax.legend()
    fig.tight_layout()
    return save(fig, out)


def plot_ladder(rows: list[dict], out: Path):
    """Final loss against non-embedding parameters per activation, with a fitted power law
    where an activation has three or more widths."""
    inits = sorted({r["init_scaling"] for r in rows})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(inits), figsize=(6 * len(inits), 4), squeeze=False)
    for col, init in enumerate(inits):
        ax = axes[0][col]
        for activation in sorted({r["activation"] for r in rows}):
            points = sorted(
                (r["params"], r["final_mean"])
                for r in rows
                if r["init_scaling"] == init and r["activation"] == activation and "final_mean" in r
            )
            if not points:
                continue
            line = ax.plot(*zip(*points, strict=False), "o", label=activation)
            if len(points) >= 3:
                a, b = power_law_fit(*map(list, zip(*points, strict=False)))
                xs = [points[0][0] * (points[-1][0] / points[0][0]) ** (i / 50) for i in range(51)]
                ax.plot(
                    xs,
                    [a * x**-b for x in xs],
                    color=line[0].get_color(),
                    lw=0.8,
                    label=f"{activation}: {a:.2f} N^-{b:.3f}",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters without the embedding")
        ax.set_ylabel("final validation loss (mean over seeds)")
        ax.set_title(f"model.init_scaling={init}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, out)


def plot_diagnostics(runs: list[Run], best: dict, selection_seed: int, out: Path):
    """Per statistic, the first (solid) and last (dashed) layer over training, per activation,
    mean over the reported seeds."""
    chosen = reported(runs, best, selection_seed)
    inits = sorted({arm[1] for arm in chosen})
    plt = pyplot()
    fig, axes = plt.subplots(
        len(STATISTICS), len(inits), figsize=(6 * len(inits), 11), squeeze=False
    )
    colors = _colors(runs)
    for col, init in enumerate(inits):
        for arm, group in sorted(chosen.items()):
            if arm[1] != init or not group[0].diagnostics:
                continue
            steps = sorted(group[0].diagnostics)
            layers = sorted({k.rsplit("/", 1)[1] for k in group[0].diagnostics[steps[0]]})
            for row, stat in enumerate(STATISTICS):
                for layer, style in ((layers[0], "-"), (layers[-1], "--")):
                    key = f"diag/{stat}/{layer}"
                    ys = [
                        sum(r.diagnostics.get(s, {}).get(key, math.nan) for r in group) / len(group)
                        for s in steps
                    ]
                    label = f"{arm[0]} {layer}" if row == 0 else None
                    axes[row][col].plot(steps, ys, style, color=colors[arm[0]], label=label)
                axes[row][col].set_ylabel(stat)
        axes[0][col].set_title(f"model.init_scaling={init}")
        axes[0][col].legend(fontsize=7)
        axes[-1][col].set_xlabel("step")
    fig.tight_layout()
    return save(fig, out)


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="run directories, or the study_runs.csv it wrote")
    parser.add_argument("--baseline", default="relu2", help="activation the others are paired with")
    parser.add_argument("--selection-seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, help="directory for study.md, study.csv, study_runs.csv and figures"
    )
    parser.add_argument("--seeds-sweep", type=Path, help="write the second stage's sweep file here")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--experiment", default="study", help="the experiment the sweep file names")
    args = parser.parse_args(argv)
    runs = read_runs(args.runs)
    setting = rate_setting(runs)
    if args.seeds_sweep and setting != "optim.lr":
        parser.error(f"--seeds-sweep writes optim.lr per arm; these runs' rates are {setting}")
    rows = comparison_rows(runs, args.baseline, args.selection_seed)
    lines = table(rows, args.baseline)
    print("\n".join(lines))
    if args.seeds_sweep:
        args.seeds_sweep.write_text(seeds_sweep(rows, args.experiment, args.seeds))
        print(f"wrote {args.seeds_sweep}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "study.md").write_text("\n".join(lines) + "\n")
        write_csv(rows, args.out / "study.csv")
        write_runs_csv(runs, args.out / "study_runs.csv")
        best = best_rates(runs, args.selection_seed)
        if any(r.seed == args.selection_seed for r in runs):  # the first stage's runs are here
            plot_rates(runs, args.selection_seed, args.out / "learning_rates.png", setting)
        curves = not any(str(p).endswith(".csv") for p in args.runs)  # a table has no curves
        if curves and any(reported(runs, best, args.selection_seed).values()):
            plot_curves(runs, best, args.selection_seed, args.baseline, args.out / "curves.png")
            plot_diagnostics(runs, best, args.selection_seed, args.out / "diagnostics.png")
        if len({r["width"] for r in rows}) > 1:
            plot_ladder(rows, args.out / "ladder.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
