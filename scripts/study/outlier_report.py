"""Which activation grows outliers, with training and with width: the outlier study's report.

    python -m scripts.study.outlier_report runs/outliers-* --out docs/outliers

Reads the outlier telemetry (``training/instruments/outliers.py``) of every run given
(``configs/sweep/outliers.yaml``). Per run and step, a tensor's statistic is summarised by its
worst layer (the largest value over layers: FP8 breaks at the worst layer, not the average).
Per activation and width, over seeds: that value early (the first measured step) and at the end,
the growth between them paired by seed, and the end at the widest width against the narrowest,
paired by seed (a seed fixes the data order at every width), each with Student's 95% interval.
Tails are heavy across seeds too (one seed's worst-layer kurtosis can be ten times another's),
so everything is computed on the logarithm: geometric means, and growth and width effects as
ratios (x2.0 [x1.2, x3.4]: twice, the interval from 1.2 to 3.4 times).
Writes ``outliers.md`` (the tables), ``outliers.csv`` (their numbers, logs of the values),
``outliers_runs.csv`` (each run's worst-layer values, which the report reads in place of the run
directories) and ``outliers.png`` (the worst layer's kurtosis of the activation's output along
training, per width, mean and range over seeds; from run directories only).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats

from eval.comparison import paired_difference
from eval.runs import Run, read_runs
from scripts.common import markdown, write_csv
from scripts.figures import pyplot, save

REPORTED = (("act_out", "kurtosis"), ("act_out", "max_over_rms"), ("residual", "kurtosis"))


def worst_layer(values: dict[str, float], tensor: str, statistic: str) -> float:
    prefix = f"outliers/{tensor}/{statistic}/"
    found = [v for k, v in values.items() if k.startswith(prefix) and math.isfinite(v)]
    return max(found) if found else math.nan


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of Student's 95% interval over seeds (nan for one seed)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    t = stats.t.ppf(0.975, len(values) - 1)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


# a run's worst-layer values as one row per reported statistic: what the tables are made of
RUN_COLUMNS = (
    "run",
    "activation",
    "width",
    "seed",
    "tensor",
    "statistic",
    "first_step",
    "last_step",
    "early",
    "end",
)


def per_run(runs: list[Run]) -> list[dict]:
    """Each run's worst-layer value of each reported statistic at its first and last measured
    step (the rows of ``outliers_runs.csv``), sorted by run."""
    out = []
    for run in sorted((r for r in runs if r.outliers), key=lambda r: r.path.name):
        first, last = min(run.outliers), max(run.outliers)
        for tensor, statistic in REPORTED:
            out.append(
                {
                    "run": run.path.name,
                    "activation": run.activation,
                    "width": run.width,
                    "seed": run.seed,
                    "tensor": tensor,
                    "statistic": statistic,
                    "first_step": first,
                    "last_step": last,
                    "early": worst_layer(run.outliers[first], tensor, statistic),
                    "end": worst_layer(run.outliers[last], tensor, statistic),
                }
            )
    return out


def read_per_run(path: Path) -> list[dict]:
    """The rows of an ``outliers_runs.csv`` that :func:`per_run` wrote, typed back."""
    with path.open(newline="") as f:
        return [
            {
                **row,
                **{k: int(row[k]) for k in ("width", "seed", "first_step", "last_step")},
                **{k: float(row[k]) for k in ("early", "end")},
            }
            for row in csv.DictReader(f)
        ]


def rows(values: list[dict]) -> list[dict]:
    """One row per (activation, width, tensor, statistic) of the per-run values: early, end and
    growth over seeds, on the logarithm."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for v in values:
        groups[(v["activation"], v["width"], v["tensor"], v["statistic"])].append(v)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], REPORTED.index(k[2:]))):
        activation, width, tensor, statistic = key
        group = groups[key]
        early = {v["seed"]: math.log(v["early"]) for v in group}
        end = {v["seed"]: math.log(v["end"]) for v in group}
        growth = paired_difference(end, early)
        early_mean, early_half = interval(list(early.values()))
        end_mean, end_half = interval(list(end.values()))
        out.append(
            {
                "activation": activation,
                "width": width,
                "tensor": tensor,
                "statistic": statistic,
                "seeds": len(group),
                "first_step": group[0]["first_step"],
                "last_step": group[0]["last_step"],
                "early_log_mean": early_mean,
                "early_log_half": early_half,
                "end_log_mean": end_mean,
                "end_log_half": end_half,
                "growth_log": growth.mean,
                "growth_log_low": growth.low,
                "growth_log_high": growth.high,
                "end_by_seed": end,
            }
        )
    return out


def width_effects(table: list[dict]) -> list[dict]:
    """Per activation and statistic: the end at the widest width against the narrowest (a
    difference of logs)."""
    by_key: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in table:
        by_key[(r["activation"], r["tensor"], r["statistic"])][r["width"]] = r
    out = []
    for (activation, tensor, statistic), widths in sorted(by_key.items()):
        if len(widths) < 2:
            continue
        narrow, wide = min(widths), max(widths)
        diff = paired_difference(widths[wide]["end_by_seed"], widths[narrow]["end_by_seed"])
        out.append(
            {
                "activation": activation,
                "tensor": tensor,
                "statistic": statistic,
                "narrow": narrow,
                "wide": wide,
                "difference": (diff.mean, diff.low, diff.high),
            }
        )
    return out


def _pm(pair: tuple[float, float]) -> str:
    """A geometric mean and its interval, from the mean of logs and its half-width."""
    mean, half = pair
    if math.isnan(half):
        return f"{math.exp(mean):.3g}"
    return f"{math.exp(mean):.3g} [{math.exp(mean - half):.3g}, {math.exp(mean + half):.3g}]"


def _ci(triple: tuple[float, float, float]) -> str:
    """A ratio and its interval, from a mean difference of logs and its interval."""
    mean, low, high = (math.exp(v) for v in triple)
    return f"x{mean:.2f} [x{low:.2f}, x{high:.2f}]"


def tables(table: list[dict], widths: list[dict]) -> list[str]:
    lines = []
    for tensor, statistic in REPORTED:
        body = [
            [
                r["activation"],
                str(r["width"]),
                _pm((r["early_log_mean"], r["early_log_half"])),
                _pm((r["end_log_mean"], r["end_log_half"])),
                _ci((r["growth_log"], r["growth_log_low"], r["growth_log_high"])),
            ]
            for r in table
            if (r["tensor"], r["statistic"]) == (tensor, statistic)
        ]
        if not body:
            continue
        steps = next(r for r in table if r["tensor"] == tensor)
        lines += [
            f"**{tensor} {statistic}**, worst layer: geometric mean [95% interval] over seeds "
            f"at step {steps['first_step']} and step {steps['last_step']}, and the growth:",
            "",
            *markdown(["activation", "width", "early", "end", "end / early [95% CI]"], body),
            "",
        ]
    body = [
        [
            w["activation"],
            f"{w['tensor']} {w['statistic']}",
            f"{w['wide']} / {w['narrow']}",
            _ci(w["difference"]),
        ]
        for w in widths
    ]
    if body:
        lines += [
            "**With width**: the end at the widest width over the narrowest, paired by seed:",
            "",
            *markdown(["activation", "statistic", "widths", "ratio [95% CI]"], body),
        ]
    return lines


def plot(runs: list[Run], out: Path) -> Path:
    plt = pyplot()
    widths = sorted({r.width for r in runs if r.outliers})
    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 3.6), squeeze=False)
    for ax, width in zip(axes[0], widths, strict=True):
        curves: dict[str, list[tuple[list[int], list[float]]]] = defaultdict(list)
        for run in runs:
            if run.width == width and run.outliers:
                steps = sorted(run.outliers)
                values = [worst_layer(run.outliers[s], "act_out", "kurtosis") for s in steps]
                curves[run.activation].append((steps, values))
        for activation, seeds in sorted(curves.items()):
            steps = seeds[0][0]
            per_step = list(zip(*[v for _, v in seeds], strict=True))
            mean = [statistics.fmean(v) for v in per_step]
            line = ax.plot(steps, mean, label=activation)[0]
            ax.fill_between(
                steps,
                [min(v) for v in per_step],
                [max(v) for v in per_step],
                color=line.get_color(),
                alpha=0.2,
            )
        ax.set_title(f"width {width}")
        ax.set_xlabel("step")
        ax.set_yscale("log")
    axes[0][0].set_ylabel("kurtosis of the activation's output\n(worst layer)")
    axes[0][-1].legend()
    return save(fig, out / "outliers.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run directories, or the outliers_runs.csv it wrote"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/outliers"))
    args = parser.parse_args(argv)
    tables_given = [p for p in args.runs if p.suffix == ".csv"]
    directories = [p for p in args.runs if p.suffix != ".csv"]
    runs = read_runs(directories) if directories else []
    values = per_run(runs) + [v for p in tables_given for v in read_per_run(p)]
    table = rows(values)
    if not table:
        raise SystemExit("no run has outlier telemetry: train with logging.outliers_every > 0")
    widths = width_effects(table)
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(tables(table, widths))
    (args.out / "outliers.md").write_text(text + "\n")
    write_csv(
        [{k: v for k, v in r.items() if k != "end_by_seed"} for r in table],
        args.out / "outliers.csv",
    )
    with (args.out / "outliers_runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RUN_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(
            sorted(values, key=lambda v: (v["run"], REPORTED.index((v["tensor"], v["statistic"]))))
        )
    print(text)
    if runs:  # the curves need the run directories' every step
        print(f"figure: {plot(runs, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
