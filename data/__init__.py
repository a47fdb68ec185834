"""Text and token sources, the paper's tokenizers, packing, and exactly resumable loaders.

Knows nothing about models or training: it yields ``{"inputs", "targets"}`` windows of token ids.
"""

from data.config import DataConfig, TokenizerConfig
from data.loader import build_loader, build_validation_loader
from data.tokenizers import Tokenizer, load_tokenizer

__all__ = [
    "DataConfig",
    "Tokenizer",
    "TokenizerConfig",
    "build_loader",
    "build_validation_loader",
    "load_tokenizer",
]
