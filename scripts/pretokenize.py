"""Tokenize a text source once into binary shards for ``data.source=tokenized``.

    python -m scripts.pretokenize OUT_DIR --source local --paths 'fineweb/*.parquet' \
        --tokenizer mistral_nemo --workers 16 --shard-tokens 500000000

Every document of the source, in its global order (held-out validation documents included, so
``data=tokenized`` holds out the same ones), becomes ``[BOS] ids EOS``; documents are written
in order into shards of about ``--shard-tokens`` tokens. What the documents are, and how they
are read, is the source's (``DataSource.pretokenize`` in ``data/sources/``): local fragments
(parquet row groups, jsonl files) are tokenized in parallel worker processes, results kept in
order. A progress bar counts tokens; skipped records are counted and reported at the end.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data import DataConfig, TokenizerConfig, available_sources, get_source, load_tokenizer
from data.shards import write_shard


def text_sources() -> list[str]:
    """The sources pretokenize can read (all but those that are tokens already)."""
    return [name for name in available_sources() if get_source(name).pretokenize]


def pretokenize(config: DataConfig, out_dir: Path, shard_tokens: int, workers: int) -> Counter:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(config.tokenizer)
    chunks = get_source(config.source).pretokenize
    if chunks is None:
        raise ValueError(
            f"data.source={config.source} cannot be pretokenized; choose one of: "
            f"{', '.join(text_sources())}"
        )
    progress = tqdm(unit="tok", unit_scale=True)
    totals, pending, shard = Counter(), [], 0

    def flush() -> None:
        nonlocal pending, shard
        if pending:
            tokens = np.concatenate(pending)
            write_shard(
                out_dir / f"shard_{shard:05d}.bin", tokens, tokenizer.eos_id, tokenizer.vocab_size
            )
            shard, pending = shard + 1, []

    for tokens, stats in chunks(config, workers):
        progress.update(len(tokens))
        totals.update(stats)
        totals["tokens"] += len(tokens)
        pending.append(tokens)
        if sum(len(p) for p in pending) >= shard_tokens:
            flush()
    flush()
    progress.close()
    totals["shards"] = shard
    return totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--source", default="local", choices=text_sources())
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
