"""Pre-tokenized binary shards: written by ``scripts/pretokenize.py``, read through memory maps
(the ``tokenized`` source, ``data.sources.tokenized``, reads them as one token stream).

File layout (little-endian): a header ``magic "XIELUTOK", u32 version, u32 bytes per token (2
or 4), u64 token count, i64 EOS id, u64 vocabulary size`` and, from version 2, ``u32 length of
the identity, u32 header bytes`` then the identity of the tokenizer that wrote the shard as
JSON (``data.tokenizers.TokenizerIdentity``: name, vocabulary size, special ids, a fingerprint
of the vocabulary), zero-padded to a multiple of 64 bytes; then the tokens as uint16 (when the
vocabulary fits) or uint32. Documents are concatenated, each followed by EOS.

A run reads shards only with the tokenizer that wrote them (:func:`check_tokenizer`, before
training): another one would train on ids that mean other text, or index past its embedding.
Version 1 shards (64-byte header, written before the identity was recorded) are read with a
warning: their vocabulary size and EOS id are checked, their vocabulary cannot be; running
``scripts.pretokenize`` again records it.

The shards form one token stream in sorted file order; ``TokenCorpus`` locates the end of the
validation slice (the first ``validation_documents`` documents, found by counting EOS).
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import asdict
from pathlib import Path

import numpy as np

from data.config import DataConfig
from data.paths import expand_paths, fingerprint, listing
from data.tokenizers import Tokenizer, TokenizerIdentity, identity_of

log = logging.getLogger(__name__)

MAGIC = b"XIELUTOK"
VERSION = 2
HEADER = struct.Struct("<8sIIQqQ")
IDENTITY = struct.Struct("<II")  # version 2: identity length, header bytes
HEADER_BYTES = 64  # version 1's whole header; version 2's is a multiple of it


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def write_shard(path: str | Path, tokens: np.ndarray, identity: TokenizerIdentity) -> None:
    """Write atomically (temporary name, then rename) so a reader never sees half a shard."""
    vocab_size = identity.vocab_size
    dtype = token_dtype(vocab_size)
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids outside [0, {vocab_size}) cannot be stored in {path}")
    record = json.dumps(asdict(identity)).encode()
    fixed = HEADER.size + IDENTITY.size
    header_bytes = -(-(fixed + len(record)) // HEADER_BYTES) * HEADER_BYTES
    header = HEADER.pack(MAGIC, VERSION, dtype.itemsize, tokens.size, identity.eos_id, vocab_size)
    header += IDENTITY.pack(len(record), header_bytes) + record
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(header.ljust(header_bytes, b"\0"))
        f.write(tokens.astype(dtype.newbyteorder("<"), copy=False).tobytes())
    tmp.replace(path)


class Shard:
    """One shard's tokens (memory-mapped) and what its header says; ``identity`` is None for a
    version 1 shard, which did not record its tokenizer."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
            if len(raw) < HEADER_BYTES or raw[:8] != MAGIC:
                raise ValueError(
                    f"{path} is not a token shard (bad magic); write it with pretokenize"
                )
            _, version, itemsize, count, self.eos_id, self.vocab_size = HEADER.unpack_from(raw)
            if version not in (1, VERSION) or itemsize not in (2, 4):
                raise ValueError(f"{path}: unsupported shard version {version} / width {itemsize}")
            self.version, self.identity, header_bytes = version, None, HEADER_BYTES
            if version >= 2:
                length, header_bytes = IDENTITY.unpack_from(raw, HEADER.size)
                f.seek(HEADER.size + IDENTITY.size)
                self.identity = TokenizerIdentity(**json.loads(f.read(length)))
        expected = header_bytes + count * itemsize
        actual = Path(path).stat().st_size
        if actual != expected:
            raise ValueError(
                f"{path} is truncated or corrupt: header says {count} tokens ({expected} bytes), "
                f"file has {actual} bytes"
            )
        dtype = np.dtype("<u2" if itemsize == 2 else "<u4")
        self.tokens = np.memmap(path, dtype=dtype, mode="r", offset=header_bytes, shape=(count,))


class TokenCorpus:
    """All shards as one stream, with the validation boundary located."""

    def __init__(self, config: DataConfig) -> None:
        files = expand_paths(config.paths, (".bin",))
        self.shards = [Shard(f) for f in files]
        eos = {s.eos_id for s in self.shards}
        if len(eos) != 1:
            raise ValueError(f"shards disagree on the EOS id ({sorted(eos)}): mixed tokenizers?")
        self.eos_id = eos.pop()
        self.starts = np.cumsum([0] + [len(s.tokens) for s in self.shards])
        self.total = int(self.starts[-1])
        self.listing = listing(files)  # each shard's name and size, read once
        self.fingerprint = fingerprint(self.listing)
        self.validation_end = self._nth_document_end(config.validation_documents)

    def _nth_document_end(self, n: int) -> int:
        """Token offset just after the n-th EOS (0 for n = 0)."""
        if n == 0:
            return 0
        seen = 0
        for shard, start in zip(self.shards, self.starts, strict=False):
            ends = np.flatnonzero(shard.tokens == self.eos_id)
            if seen + len(ends) >= n:
                return int(start + ends[n - seen - 1] + 1)
            seen += len(ends)
        raise ValueError(f"the token shards hold fewer than validation_documents={n} documents")

    def slice(self, begin: int, end: int) -> np.ndarray:
        """Tokens [begin, end) of the concatenated stream, across shard boundaries."""
        parts = []
        first = int(np.searchsorted(self.starts, begin, side="right")) - 1
        for i in range(max(first, 0), len(self.shards)):
            if self.starts[i] >= end:
                break
            lo, hi = max(begin, self.starts[i]), min(end, self.starts[i + 1])
            if lo < hi:  # an empty shard in the middle contributes nothing
                parts.append(self.shards[i].tokens[lo - self.starts[i] : hi - self.starts[i]])
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(parts).astype(np.int64)


def check_tokenizer(config: DataConfig, tokenizer: Tokenizer) -> None:
    """Refuse shards written by another tokenizer than ``data.tokenizer``, naming both and
    what to do; warn once for version 1 shards, whose vocabulary cannot be checked."""
    files = expand_paths(config.paths, (".bin",))
    ours = identity_of(tokenizer)
    legacy = []
    for path in files:
        shard = Shard(path)
        if shard.identity is None:
            theirs = {"vocab_size": shard.vocab_size, "eos_id": shard.eos_id}
            differs = [
                f"{key} {getattr(ours, key)!r} vs {value!r}"
                for key, value in theirs.items()
                if getattr(ours, key) != value
            ]
            written_by = "a tokenizer it did not record"
            legacy.append(path)
        else:
            differs = ours.differences(shard.identity)
            written_by = f"tokenizer {shard.identity.name!r}"
        if differs:
            raise ValueError(
                f"{path} was written by {written_by} and data.tokenizer.name={ours.name!r} "
                f"reads it otherwise (data.tokenizer against the shard: {'; '.join(differs)}). "
                "Train with the tokenizer that wrote the shards, or write them again with this "
                f"one: python -m scripts.pretokenize OUT_DIR --tokenizer {ours.name} --replace ..."
            )
    if legacy:
        log.warning(
            "%d of the %d shards (%s, ...) were written before shards recorded their tokenizer: "
            "their vocabulary size and EOS id match data.tokenizer, their vocabulary itself "
            "cannot be checked; run scripts.pretokenize again to record it",
            len(legacy),
            len(files),
            legacy[0],
        )
