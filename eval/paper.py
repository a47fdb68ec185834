"""The paper's reported numbers, as data: what our tables are printed beside and tested against.

Huang & Schlag (ICML 2025): the ablation table (1.1B, 4B tokens, Llama 3 tokenizer, perplexity)
and the main comparison (1.1B and 3B, 125B tokens).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AblationRow:
    activation: str  # the registry name that reproduces the row
    label: str
    modification: str
    perplexity: float


ABLATION_TABLE = [
    AblationRow("xielu", "xIELU", "-", 17.52),
    AblationRow("xiprelu", "xIPReLU", "-", 17.52),
    AblationRow("swiglu", "SwiGLU", "-", 17.58),
    AblationRow("xielu_pos_cubic", "xIELU", "Positive component x^3", 17.75),
    AblationRow("xielu_neg_xsilu", "xIELU", "Negative component xSiLU", 17.84),
    AblationRow("xielu_trainable_beta", "xIELU", "Trainable beta_p = beta_n", 17.88),
    AblationRow("xiprelu_beta0", "xIPReLU", "Fixed beta_p = beta_n = 0.0", 17.91),
    AblationRow("xsilu", "xSiLU", "-", 17.91),
    AblationRow("relu2", "ReLU^2", "-", 18.12),
    AblationRow("xielu_beta1", "xIELU", "Fixed beta_p = beta_n = 1.0", 18.15),
    AblationRow("xielu_neg_silu", "xIELU", "Negative component SiLU", 18.18),
    AblationRow("xielu_neg_zero", "xIELU", "Negative component set to 0", 18.40),
    AblationRow("silu", "SiLU", "-", 18.57),
]

# the main comparison: experiment -> activations trained
MAIN_COMPARISON = {
    "paper_1b": ["swiglu", "relu2", "xiprelu", "xielu"],
    "paper_3b": ["swiglu", "xielu"],
}
