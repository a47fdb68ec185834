"""The paper's results tables from run directories, as Markdown and CSV.

    python -m scripts.results_table runs/mini_ablation-*                 # main-table layout
    python -m scripts.results_table runs/ablation_1b-* --ablation --csv results/ablation.csv

Main layout: validation loss and perplexity at the end of the stable phase (the step where the
WSD cooldown starts) and at the end of the run, per activation. ``--ablation``: the final
perplexity per row, sorted, beside the paper's number for the same activation.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from eval.paper import ABLATION_TABLE
from eval.runs import read_metrics
from scripts.common import markdown, write_csv
from training.checkpoint import run_config
from training.schedule import stable_phase_end


def summarise(run_dir: str) -> dict:
    config = run_config(run_dir)
    steps = config.trainer.steps
    stable_end = stable_phase_end(config.schedule, steps)  # None without a cooldown
    val = {r["step"]: r["val/loss"] for r in read_metrics(run_dir) if "val/loss" in r}
    row = {
        "run": Path(run_dir).name,
        "activation": config.model.activation,
        "steps": max(val, default=0),
        "stable_loss": val.get(stable_end) if stable_end else None,
        "final_loss": val.get(steps),
    }
    for key in ("stable", "final"):
        loss = row[f"{key}_loss"]
        row[f"{key}_ppl"] = math.exp(loss) if loss is not None else None
    return row


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main_table(rows: list[dict]) -> list[str]:
    header = [
        "activation",
        "loss end of stable",
        "ppl end of stable",
        "loss after cooldown",
        "ppl after cooldown",
    ]
    ordered = sorted(rows, key=lambda r: r["final_loss"] if r["final_loss"] else math.inf)
    return markdown(
        header,
        [
            [
                r["activation"],
                _fmt(r["stable_loss"]),
                _fmt(r["stable_ppl"], 2),
                _fmt(r["final_loss"]),
                _fmt(r["final_ppl"], 2),
            ]
            for r in ordered
        ],
    )


def ablation_table(rows: list[dict]) -> list[str]:
    paper = {row.activation: row for row in ABLATION_TABLE}
    table = []
    for r in sorted(rows, key=lambda r: r["final_ppl"] if r["final_ppl"] else math.inf):
        ref = paper.get(r["activation"])
        table.append(
            [
                ref.label if ref else r["activation"],
                ref.modification if ref else "?",
                _fmt(r["final_ppl"], 2),
                _fmt(ref.perplexity, 2) if ref else "-",
            ]
        )
    return markdown(["activation", "modification", "perplexity", "paper perplexity"], table)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--ablation", action="store_true")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    rows = [summarise(run) for run in args.runs]
    print("\n".join(ablation_table(rows) if args.ablation else main_table(rows)))
    if args.csv:
        write_csv(rows, args.csv)
    return rows


if __name__ == "__main__":
    main()
