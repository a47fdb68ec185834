"""The figure scripts run on a real (tiny) run and draw what the run holds: each writes a PNG
that is a non-blank image, and its curves carry the run's numbers, not stale or made-up ones.

A wrapper around ``scripts.figures.save`` keeps each figure object, so the drawn lines can be
read back after the script has written and closed the figure.
"""

import math

import matplotlib.image
import pytest
import torch

from train_helpers import metrics
from training.checkpoint import load_trained_model


@pytest.fixture
def figures(monkeypatch):
    """Figures as the scripts saved them, in order."""
    import scripts.figures

    kept = []
    real_save = scripts.figures.save

    def keep(fig, out):
        kept.append(fig)
        return real_save(fig, out)

    for module in ("plot_curves", "plot_alphas", "plot_activations"):
        monkeypatch.setattr(f"scripts.{module}.save", keep)
    return kept


def assert_drawn_png(path, figure):
    """A PNG of the figure's pixel size with more than a background colour on it."""
    image = matplotlib.image.imread(path)
    width, height = figure.get_size_inches() * figure.dpi
    assert image.shape[:2] == (round(height), round(width))
    assert len(torch.from_numpy(image.reshape(-1, image.shape[-1])).unique(dim=0)) > 10


def lines_by_label(axes) -> dict:
    return {line.get_label(): line for line in axes.get_lines()}


@pytest.mark.slow
def test_plot_curves_draws_the_runs_training_and_validation_loss(reference, tmp_path, figures):
    from scripts.plot_curves import main

    run_dir, losses = reference
    out = tmp_path / "curves.png"
    main([str(out), str(run_dir)])
    (figure,) = figures
    assert_drawn_png(out, figure)
    lines = lines_by_label(figure.axes[0])
    train, val = lines[f"{run_dir.name} train"], lines[f"{run_dir.name} val"]
    records = metrics(run_dir)
    assert list(train.get_ydata()) == [losses[s] for s in sorted(losses)]
    assert list(train.get_xdata()) == [s * 4 * 32 for s in sorted(losses)]  # 4 x 32 per step
    validation = {m["step"]: m["val/loss"] for m in records if "val/loss" in m}
    assert list(val.get_xdata()) == [s * 4 * 32 for s in validation]
    assert list(val.get_ydata()) == list(validation.values())

    main([str(out), str(run_dir), "--perplexity"])
    ppl = lines_by_label(figures[-1].axes[0])[f"{run_dir.name} train"]
    assert list(ppl.get_ydata()) == pytest.approx([math.exp(losses[s]) for s in sorted(losses)])


@pytest.mark.slow
def test_plot_alphas_draws_each_layers_learned_alphas_and_curves(reference, tmp_path, figures):
    from scripts.plot_alphas import main

    run_dir, _ = reference
    depth, curves = tmp_path / "alphas.png", tmp_path / "layers.png"
    main([str(depth), str(run_dir), "--step", "8", "--curves", str(curves)])
    depth_figure, curves_figure = figures
    assert_drawn_png(depth, depth_figure)
    assert_drawn_png(curves, curves_figure)
    model, _, _ = load_trained_model(run_dir, 8)
    learned = model.activation_scalars()  # the step-8 checkpoint's, not the final ones
    assert learned != load_trained_model(run_dir)[0].activation_scalars()
    for axes, key in zip(depth_figure.axes, ("alpha_p", "alpha_n"), strict=True):
        (line,) = axes.get_lines()
        assert list(line.get_xdata()) == [0.0, 1.0]  # two layers: normalised depth 0 and 1
        assert list(line.get_ydata()) == pytest.approx([layer[key] for layer in learned])
    # the per-layer curves: xIELU's closed form (paper eq. 8) with each layer's alphas
    values = curves_figure.axes[0].get_lines()
    assert len(values) == 2
    for line, alphas in zip(values, learned, strict=True):
        x = torch.as_tensor(line.get_xdata())
        ap, an = alphas["alpha_p"], alphas["alpha_n"]
        negative = an * torch.expm1(x.clamp(max=-1e-6)) - an * x + 0.5 * x
        expected = torch.where(x > 0, ap * x * x + 0.5 * x, negative)
        drawn = torch.as_tensor(line.get_ydata())
        torch.testing.assert_close(drawn, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_plot_activations_draws_the_registered_functions_and_slopes(tmp_path, figures):
    from scripts.plot_activations import main

    out = tmp_path / "activations.png"
    main([str(out), "--names", "relu2", "xiprelu", "--alpha-p", "0.3", "--alpha-n", "1.5"])
    (figure,) = figures
    assert_drawn_png(out, figure)
    f, slope = (lines_by_label(axes) for axes in figure.axes)
    x = torch.as_tensor(f["relu2"].get_xdata())
    relu = x.clamp(min=0)
    torch.testing.assert_close(torch.as_tensor(f["relu2"].get_ydata()), relu**2)
    torch.testing.assert_close(torch.as_tensor(slope["relu2"].get_ydata()), 2 * relu)
    # xIPReLU (paper eq. 18) at the alphas asked for: 0.3 x² + x/2 above 0, 1.5 x² + x/2 below
    ap, an = 0.3, 1.5
    xiprelu = torch.where(x > 0, ap * x * x, an * x * x) + 0.5 * x
    xiprelu_slope = torch.where(x > 0, 2 * ap * x, 2 * an * x) + 0.5
    torch.testing.assert_close(torch.as_tensor(f["xiprelu"].get_ydata()), xiprelu)
    torch.testing.assert_close(torch.as_tensor(slope["xiprelu"].get_ydata()), xiprelu_slope)


@pytest.mark.slow
def test_plot_alphas_draws_whatever_scalars_the_activation_declares(corpus, tmp_path, figures):
    """xSiLU declares one scalar, ``alpha``: one panel, its learned value per layer (there is no
    alpha_p / alpha_n to look up)."""
    from scripts.plot_alphas import main
    from train_helpers import run_in_process, tiny_overrides

    run_dir = tmp_path / "xsilu"
    overrides = tiny_overrides(corpus, run_dir, activation="xsilu", **{"trainer.steps": 6})
    assert run_in_process(overrides) == 0
    main([str(tmp_path / "alphas.png"), str(run_dir)])
    (figure,) = figures
    (axes,) = figure.axes
    assert axes.get_ylabel() == "alpha"
    (line,) = axes.get_lines()
    learned = load_trained_model(run_dir)[0].activation_scalars()
    assert list(line.get_ydata()) == pytest.approx([layer["alpha"] for layer in learned])
