"""What every figure script shares: a headless pyplot, saving, and curves of an activation."""

from __future__ import annotations

from pathlib import Path

import torch


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display on cluster nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    pyplot().close(fig)
    return out


def grid(lo: float, hi: float, points: int = 1200) -> torch.Tensor:
    """x values for a curve, float64, never exactly 0 (for lo < 0 < hi with an even count).

    At x = 0 the paper's xIELU takes its negative branch with the input clamped to -1e-6, so
    its slope there is beta - alpha_n, not beta: true, but 1e-6 wide, and one sample on it
    draws a spike no reader could see in the function itself.
    """
    x = torch.linspace(lo, hi, points, dtype=torch.float64)
    return x[x != 0]


def value_and_slope(act: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f(x) and f'(x) of an activation module in float64, the slope by autograd."""
    act = act.double()
    x = x.double().detach().requires_grad_(True)
    y = act(x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    return y.detach(), dy
