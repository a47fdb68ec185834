"""Text and token sources, the paper's tokenizers, packing, and exactly resumable loaders.

Knows nothing about models or training: it yields ``{"inputs", "targets"}`` windows of token ids
(targets equal to ``IGNORE_INDEX`` are padding). Sources are looked up by name in the table of
``data/sources/__init__.py``; each is one module there, and those read from text files share
``data.text``. A resume takes every rank's saved data state from the checkpoint
(``restore_loader``) and decides here whether to re-partition it.
"""

from data.config import DataConfig, TokenizerConfig
from data.loader import (
    build_loader,
    build_validation_loader,
    build_validation_loaders,
    counters,
    first_batch,
)
from data.mixture import source_tokens
from data.packing import IGNORE_INDEX
from data.restore import needs_every_rank, restore_loader
from data.source import DataError
from data.sources import available_sources, check_inputs, check_sources, get_source
from data.tokenizers import Tokenizer, load_tokenizer

__all__ = [
    "IGNORE_INDEX",
    "DataConfig",
    "DataError",
    "Tokenizer",
    "TokenizerConfig",
    "available_sources",
    "build_loader",
    "build_validation_loader",
    "build_validation_loaders",
    "check_inputs",
    "check_sources",
    "counters",
    "first_batch",
    "get_source",
    "load_tokenizer",
    "needs_every_rank",
    "restore_loader",
    "source_tokens",
]
