"""Learned alpha_p / alpha_n against normalised depth (the paper's depth figure), and every
layer's xIELU curve coloured by depth (its appendix figures), from run checkpoints.

    python -m scripts.plot_alphas figures/alphas.png runs/paper_1b-xielu runs/paper_3b-xielu
    python -m scripts.plot_alphas figures/alphas.pdf RUN --step 5000 --curves figures/curves.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scripts.figures import grid, pyplot, save, value_and_slope
from training.checkpoint import load_trained_model


def learned_alphas(run_dir: str, step: int | None = None) -> tuple[list[dict], object]:
    model, config, step = load_trained_model(run_dir, step)
    scalars = model.activation_scalars()
    if not scalars or not scalars[0]:
        raise ValueError(f"{run_dir}: activation {config.model.activation!r} has no alphas")
    return scalars, model


def plot_depth(runs: list[str], out: Path, step: int | None = None) -> Path:
    """One panel per scalar the runs' activations declare (alpha_p and alpha_n for xIELU,
    alpha for xSiLU, beta too when it is trainable), each run's values against depth."""
    plt = pyplot()
    learned = {run: learned_alphas(run, step)[0] for run in runs}
    keys = list(dict.fromkeys(key for scalars in learned.values() for key in scalars[0]))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    axes = axes[0]
    for run, scalars in learned.items():
        depth = [i / max(len(scalars) - 1, 1) for i in range(len(scalars))]
        for ax, key in zip(axes, keys, strict=True):
            if key in scalars[0]:
                values = [s[key] for s in scalars]
                ax.plot(depth, values, marker="o", ms=3, label=Path(run).name)
    for ax, key in zip(axes, keys, strict=True):
        ax.set_xlabel("normalised depth")
        ax.set_ylabel(key)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, out)


def plot_layer_curves(run: str, out: Path, step: int | None = None) -> Path:
    plt = pyplot()
    _, model = learned_alphas(run, step)
    x = grid(-4.0, 2.0)
    fig, (ax_f, ax_d) = plt.subplots(1, 2, figsize=(10, 4))
    cmap = plt.get_cmap("viridis")
    n = len(model.layers)
    for i, layer in enumerate(model.layers):
        y, dy = value_and_slope(layer.mlp.act_fn, x)
        color = cmap(i / max(n - 1, 1))
        ax_f.plot(x, y, color=color, lw=1)
        ax_d.plot(x, dy, color=color, lw=1)
    ax_f.set_title("f(x) per layer (dark: first, light: last)")
    ax_d.set_title("f'(x) per layer")
    fig.tight_layout()
    return save(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--step", type=int)
    parser.add_argument("--curves", type=Path, help="also the per-layer curves of the first run")
    args = parser.parse_args(argv)
    print(f"wrote {plot_depth(args.runs, args.out, args.step)}")
    if args.curves:
        print(f"wrote {plot_layer_curves(args.runs[0], args.curves, args.step)}")


if __name__ == "__main__":
    main()
