"""README's Python examples run as written and do what their comments say, so the documented
API stays true. Each example's claims are checked against independent truth (the paper's
formulas, autograd) in the namespace the example leaves behind."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def library_tour(ns: dict) -> None:
    """The first example's comments: the default scalars, gated SwiGLU, the folded module."""
    act = ns["act"]
    assert ns["y"].shape == (4, 1024)
    assert act.effective_scalars() == pytest.approx({"alpha_p": 0.8, "alpha_n": 0.8})
    assert ns["is_gated"]("swiglu") is True and ns["is_gated"]("xielu") is False
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(ns["swiglu"](gate, up), torch.nn.functional.silu(gate) * up)
    x = torch.linspace(-5, 3, 101)
    torch.testing.assert_close(ns["infer"](x), act(x).detach())
    # paper eq. 8 at alpha_p = alpha_n = 0.8, beta = 0.5, eps = -1e-6
    negative = 0.8 * torch.expm1(x.clamp(max=-1e-6)) - 0.8 * x + 0.5 * x
    torch.testing.assert_close(act(x).detach(), torch.where(x > 0, 0.8 * x * x + 0.5 * x, negative))


def designed_tanh(ns: dict) -> None:
    """The design example's comment: slope 2 alpha_p x + 0.5 above zero, alpha_n tanh(x) + 0.5
    below (both alphas 0.8 through softplus at init), checked by autograd."""
    x = torch.linspace(-3, 3, 60, dtype=torch.float64).requires_grad_()
    (slope,) = torch.autograd.grad(ns["act"].double()(x).sum(), x)
    x = x.detach()
    expected = torch.where(x > 0, 2 * 0.8 * x + 0.5, 0.8 * torch.tanh(x) + 0.5)
    torch.testing.assert_close(slope, expected)


CLAIMS = {"act.effective_scalars()": library_tour, "tanh_base = BaseGradient": designed_tanh}


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_runs_and_keeps_its_comments_promises(index):
    block = BLOCKS[index]
    namespace: dict = {}
    exec(compile(block, f"README.md[python block {index}]", "exec"), namespace)
    checks = [check for marker, check in CLAIMS.items() if marker in block]
    assert checks, f"README python block {index} has no check of what its comments say"
    for check in checks:
        check(namespace)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
