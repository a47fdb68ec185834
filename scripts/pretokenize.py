"""Tokenize a text source once into binary shards for ``data.source=tokenized``.

    python scripts/pretokenize.py OUT_DIR --source local --paths 'fineweb/*.parquet' \
        --tokenizer mistral_nemo --workers 16 --shard-tokens 500000000

Every document of the source, in its global order (held-out validation documents included, so
``data=tokenized`` holds out the same ones), becomes ``[BOS] ids EOS``; documents are written
in order into shards of about ``--shard-tokens`` tokens. Local fragments (parquet row groups,
jsonl files) are tokenized in parallel worker processes, results kept in order; a progress bar
counts fragments. Skipped records are counted and reported at the end.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.config import DataConfig, TokenizerConfig
from data.shards import write_shard
from data.stream import text_source
from data.tokenizers import document_ids, load_tokenizer

_worker: dict = {}


def _init(config: DataConfig) -> None:
    _worker["config"] = config
    _worker["source"] = text_source(config)
    _worker["tokenizer"] = load_tokenizer(config.tokenizer)


def _tokenize_fragment(index: int) -> tuple[np.ndarray, Counter]:
    source, tokenizer = _worker["source"], _worker["tokenizer"]
    add_bos = _worker["config"].tokenizer.add_bos
    source.stats.clear()
    docs = [np.zeros(0, dtype=np.int64)]
    for _, text in source.read(source.fragments[index]):
        if text is not None:
            docs.append(document_ids(tokenizer, text, add_bos))
            source.stats["documents"] += 1
    return np.concatenate(docs), Counter(source.stats)


def fragment_tokens(config: DataConfig, workers: int) -> Iterator[tuple[np.ndarray, Counter]]:
    n = len(text_source(config).fragments)
    if workers <= 1:
        _init(config)
        yield from (_tokenize_fragment(i) for i in tqdm(range(n), unit="fragment"))
        return
    with get_context("spawn").Pool(workers, initializer=_init, initargs=(config,)) as pool:
        yield from tqdm(pool.imap(_tokenize_fragment, range(n)), total=n, unit="fragment")


def hub_tokens(config: DataConfig, batch: int = 1000) -> Iterator[tuple[np.ndarray, Counter]]:
    from data.hub import hub_documents

    tokenizer = load_tokenizer(config.tokenizer)
    docs, stats = [np.zeros(0, dtype=np.int64)], Counter()
    for text in tqdm(hub_documents(config, validation=False), unit="doc"):
        if text is None:
            stats["skipped"] += 1
            continue
        docs.append(document_ids(tokenizer, text, config.tokenizer.add_bos))
        stats["documents"] += 1
        if stats["documents"] % batch == 0:
            yield np.concatenate(docs), stats
            docs, stats = [np.zeros(0, dtype=np.int64)], Counter()
    yield np.concatenate(docs), stats


def pretokenize(config: DataConfig, out_dir: Path, shard_tokens: int, workers: int) -> Counter:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(config.tokenizer)
    parts = (
        hub_tokens(config) if config.source == "fineweb_edu" else fragment_tokens(config, workers)
    )
    totals, pending, shard = Counter(), [], 0

    def flush() -> None:
        nonlocal pending, shard
        if pending:
            tokens = np.concatenate(pending)
            write_shard(
                out_dir / f"shard_{shard:05d}.bin", tokens, tokenizer.eos_id, tokenizer.vocab_size
            )
            shard, pending = shard + 1, []

    for tokens, stats in parts:
        totals.update(stats)
        totals["tokens"] += len(tokens)
        pending.append(tokens)
        if sum(len(p) for p in pending) >= shard_tokens:
            flush()
    flush()
    totals["shards"] = shard
    return totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--source", default="local", choices=["local", "builtin", "fineweb_edu"])
    parser.add_argument("--paths", nargs="*", default=[])
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--hub-config", default="sample-10BT")
    parser.add_argument("--min-int-score", type=int)
    parser.add_argument("--tokenizer", default="mistral_nemo")
    parser.add_argument("--tokenizer-path")
    parser.add_argument("--add-bos", action="store_true")
    parser.add_argument("--shard-tokens", type=int, default=500_000_000)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    config = DataConfig(
        source=args.source,
        paths=args.paths,
        text_column=args.text_column,
        hub_config=args.hub_config,
        min_int_score=args.min_int_score,
        tokenizer=TokenizerConfig(args.tokenizer, args.tokenizer_path, args.add_bos),
    )
    totals = pretokenize(config, args.out_dir, args.shard_tokens, args.workers)
    print(", ".join(f"{k}: {v:,}" for k, v in sorted(totals.items())))


if __name__ == "__main__":
    main()
