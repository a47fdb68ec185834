"""The paper's reported numbers, as data: what our tables are printed beside and tested against.

Huang & Schlag (ICML 2025): the ablation table (1.1B, 4B tokens, Llama 3 tokenizer, perplexity)
the main comparison (1.1B and 3B, 125B tokens) and the efficiency table (1.1B, 4 GH200 GPUs,
batch 5 x 4096 tokens per GPU; xIELU and xIPReLU there were unfused, ``torch.compile`` only).
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


@dataclass(frozen=True)
class EfficiencyRow:
    activation: str
    mlp_hidden: int
    memory_percent: int  # of GPU memory
    ms_per_iteration: float


EFFICIENCY_TABLE = [
    EfficiencyRow("xielu", 9216, 87, 560),
    EfficiencyRow("swiglu", 6144, 87, 549),
    EfficiencyRow("gelu", 9216, 87, 544),
    EfficiencyRow("xiprelu", 9216, 87, 542),
    EfficiencyRow("silu", 9216, 87, 540),
    EfficiencyRow("relu2", 9216, 87, 534),
]
