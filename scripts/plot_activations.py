"""The paper's first two figures: activation functions and their derivatives.

    python -m scripts.plot_activations figures/activations.png
    python -m scripts.plot_activations out.pdf --names xielu xiprelu --alpha-p 0.3 --alpha-n 1.5

Curves come straight from the ``xielu`` registry (the modules training uses); derivatives are
taken by autograd, so the plot shows exactly what the fused kernels compute.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from scripts.figures import grid, pyplot, save, value_and_slope
from xielu import get_activation, is_gated

DEFAULT = ["elu", "relu2", "xsilu", "xielu", "xiprelu"]
ALPHA_OPTIONS = {
    "xielu": ("alpha_p_init", "alpha_n_init"),
    "xiprelu": ("alpha_p_init", "alpha_n_init"),
}


def curves(name: str, x: torch.Tensor, alpha_p: float | None, alpha_n: float | None):
    """(f(x), f'(x)) of a registered, non-gated activation, in float64."""
    if is_gated(name):
        raise ValueError(f"{name!r} is gated (two inputs) and has no single curve to plot")
    kwargs = {}
    if name in ALPHA_OPTIONS:
        p_key, n_key = ALPHA_OPTIONS[name]
        if alpha_p is not None:
            kwargs[p_key] = alpha_p
        if alpha_n is not None:
            kwargs[n_key] = alpha_n
    return value_and_slope(get_activation(name, **kwargs), x)


def plot(names: list[str], out: Path, alpha_p=None, alpha_n=None, lo=-4.0, hi=2.0) -> Path:
    plt = pyplot()
    x = grid(lo, hi)
    fig, (ax_f, ax_d) = plt.subplots(1, 2, figsize=(10, 4))
    for name in names:
        y, dy = curves(name, x, alpha_p, alpha_n)
        ax_f.plot(x, y, label=name)
        ax_d.plot(x, dy, label=name)
    for ax, title in ((ax_f, "f(x)"), (ax_d, "f'(x)")):
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(title)
        ax.set_xlabel("x")
        ax.legend()
    ax_f.set_ylim(-1.5, 4)
    ax_d.set_ylim(-1.5, 4)
    fig.tight_layout()
    return save(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help=".png or .pdf")
    parser.add_argument("--names", nargs="+", default=DEFAULT)
    parser.add_argument("--alpha-p", type=float)
    parser.add_argument("--alpha-n", type=float)
    args = parser.parse_args(argv)
    print(f"wrote {plot(args.names, args.out, args.alpha_p, args.alpha_n)}")


if __name__ == "__main__":
    main()
