"""Training (and validation) loss of several runs against tokens seen, from ``metrics.jsonl``.

python -m scripts.plot_curves figures/loss.png runs/mini-swiglu runs/mini-xielu [--perplexity]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from eval.runs import read_metrics
from scripts.figures import pyplot, save


def plot(runs: list[str], out: Path, perplexity: bool = False) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        records = read_metrics(run)
        train = [r for r in records if "loss" in r and math.isfinite(r["loss"])]
        tokens_per_step = train[-1]["tokens"] / train[-1]["step"] if train else 0
        tokens_at = {r["step"]: r["tokens"] for r in train}  # exact under a batch ramp
        f = math.exp if perplexity else (lambda v: v)
        line = ax.plot(
            [r["tokens"] for r in train],
            [f(r["loss"]) for r in train],
            lw=1,
            alpha=0.7,
            label=f"{Path(run).name} train",
        )
        val = [r for r in records if "val/loss" in r]
        if val:
            ax.plot(
                [tokens_at.get(r["step"], r["step"] * tokens_per_step) for r in val],
                [f(r["val/loss"]) for r in val],
                "o--",
                color=line[0].get_color(),
                label=f"{Path(run).name} val",
            )
    ax.set_xlabel("tokens")
    ax.set_ylabel("perplexity" if perplexity else "loss (nats/token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--perplexity", action="store_true")
    args = parser.parse_args(argv)
    print(f"wrote {plot(args.runs, args.out, args.perplexity)}")


if __name__ == "__main__":
    main()
