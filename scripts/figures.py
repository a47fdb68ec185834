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


def value_and_slope(act: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f(x) and f'(x) of an activation module in float64, the slope by autograd."""
    act = act.double()
    x = x.double().detach().requires_grad_(True)
    y = act(x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    return y.detach(), dy
