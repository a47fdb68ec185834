"""Every document of a text source, tokenized in worker processes for ``scripts/pretokenize.py``.

One chunk per fragment: fragments are independent, so they tokenize in parallel and come back
in order (``Pool.imap``), which keeps the documents in the global order the shards must have.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing import get_context

import numpy as np

from data.config import DataConfig
from data.text.files import TextSource, local_files
from data.tokenizers import encode_document, load_tokenizer

_worker: dict = {}


def _open_worker(config: DataConfig, open_files: Callable[[DataConfig], TextSource]) -> None:
    _worker.update(
        config=config, source=open_files(config), tokenizer=load_tokenizer(config.tokenizer)
    )


def _tokenize_fragment(index: int) -> tuple[np.ndarray, Counter]:
    source, tokenizer = _worker["source"], _worker["tokenizer"]
    add_bos = _worker["config"].tokenizer.add_bos
    docs, stats = [np.zeros(0, dtype=np.int64)], Counter()
    for _, text, skipped in source.records(source.fragments[index]):
        if text is None:
            stats[skipped] += 1
            continue
        docs.append(encode_document(tokenizer, text, add_bos))
        stats["documents"] += 1
    return np.concatenate(docs), stats


def pretokenize_chunks(
    config: DataConfig,
    workers: int,
    *,
    open_files: Callable[[DataConfig], TextSource] = local_files,
) -> Iterator[tuple[np.ndarray, Counter]]:
    """Every document, one chunk per fragment, tokenized in ``workers`` processes (in order)."""
    source = open_files(config)
    if source.unreadable:
        yield np.zeros(0, dtype=np.int64), Counter(bad_files=len(source.unreadable))
    n = len(source.fragments)
    if workers <= 1:
        _open_worker(config, open_files)
        yield from map(_tokenize_fragment, range(n))
        return
    context = get_context("spawn")
    with context.Pool(workers, initializer=_open_worker, initargs=(config, open_files)) as pool:
        yield from pool.imap(_tokenize_fragment, range(n))
