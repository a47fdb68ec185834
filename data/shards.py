"""Pre-tokenized binary shards: written by ``scripts/pretokenize.py``, read through memory maps
(the ``tokenized`` source, ``data.sources.tokenized``, reads them as one token stream).

File layout (little-endian): a 64-byte header ``magic "XIELUTOK", u32 version, u32 bytes per
token (2 or 4), u64 token count, i64 EOS id, u64 vocabulary size``, zero-padded, then the tokens
as uint16 (when the vocabulary fits) or uint32. Documents are concatenated, each followed by EOS.

The shards form one token stream in sorted file order; ``TokenCorpus`` locates the end of the
validation slice (the first ``validation_documents`` documents, found by counting EOS).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from data.config import DataConfig
from data.paths import expand_paths, fingerprint

MAGIC = b"XIELUTOK"
VERSION = 1
HEADER = struct.Struct("<8sIIQqQ")
HEADER_BYTES = 64


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def write_shard(path: str | Path, tokens: np.ndarray, eos_id: int, vocab_size: int) -> None:
    """Write atomically (temporary name, then rename) so a reader never sees half a shard."""
    dtype = token_dtype(vocab_size)
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids outside [0, {vocab_size}) cannot be stored in {path}")
    header = HEADER.pack(MAGIC, VERSION, dtype.itemsize, tokens.size, eos_id, vocab_size)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(header.ljust(HEADER_BYTES, b"\0"))
        f.write(tokens.astype(dtype.newbyteorder("<"), copy=False).tobytes())
    tmp.replace(path)


class Shard:
    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
        if len(raw) < HEADER_BYTES or raw[:8] != MAGIC:
            raise ValueError(f"{path} is not a token shard (bad magic); write it with pretokenize")
        _, version, itemsize, count, self.eos_id, self.vocab_size = HEADER.unpack_from(raw)
        if version != VERSION or itemsize not in (2, 4):
            raise ValueError(f"{path}: unsupported shard version {version} / width {itemsize}")
        expected = HEADER_BYTES + count * itemsize
        actual = Path(path).stat().st_size
        if actual != expected:
            raise ValueError(
                f"{path} is truncated or corrupt: header says {count} tokens ({expected} bytes), "
                f"file has {actual} bytes"
            )
        dtype = np.dtype("<u2" if itemsize == 2 else "<u4")
        self.tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))


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
        self.fingerprint = fingerprint(files)
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
