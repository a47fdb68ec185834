"""A Llama decoder with a pluggable MLP activation (knows nothing about data or training)."""

from model.config import ModelConfig, pad_vocab
from model.flops import ParameterCount, count_parameters, training_flops_per_token
from model.llama import Llama

__all__ = [
    "Llama",
    "ModelConfig",
    "ParameterCount",
    "count_parameters",
    "pad_vocab",
    "training_flops_per_token",
]
