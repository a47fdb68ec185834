"""Benchmark the data pipeline against the raw tokenizer on the same text, in one process.

    python -m scripts.bench.data                                # builtin corpus as parquet
    python -m scripts.bench.data --paths 'fineweb/*.parquet' --tokenizer llama3

Rows: the tokenizer's encode rate on the documents already in memory (the ceiling), and the
training pipeline read -> tokenize -> pack -> batch from parquet through the real
``StatefulDataLoader`` (``num_workers=0``: one process). Targets: the pipeline keeps >= 80% of
the raw rate, and delivers >= 50x what one GH200 consumes in the paper's 1.1B run (5 x 4096
tokens per GPU per 0.56 s iteration, about 37k tokens/s). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data import DataConfig, TokenizerConfig, build_loader, load_tokenizer
from data.sources.builtin import build_documents
from data.text import TextSource

GH200_TOKENS_PER_S = 5 * 4096 / 0.56  # the paper's efficiency table, 1.1B, per GPU


def documents(paths: list[str]) -> list[str]:
    source = TextSource(paths)
    return [t for f in source.fragments for _, t in source.read(f) if t is not None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paths", nargs="*", help="parquet/jsonl globs (default: builtin)")
    parser.add_argument("--tokenizer", default="mistral_nemo")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        paths = args.paths
        if not paths:
            path = Path(tmp) / "builtin.parquet"
            pq.write_table(pa.table({"text": build_documents()}), path, row_group_size=64)
            paths = [str(path)]
        docs = documents(paths)
        tokenizer = load_tokenizer(TokenizerConfig(args.tokenizer))
        tokenizer.encode(docs[0])  # warm caches

        raw_rates, pipe_rates = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            n = sum(len(tokenizer.encode(d)) + 1 for d in docs)
            raw_rates.append(n / (time.perf_counter() - start))

            config = DataConfig(
                source="local",
                paths=paths,
                seq_len=args.seq_len,
                validation_documents=0,
                num_workers=0,
                tokenizer=TokenizerConfig(args.tokenizer),
            )
            loader = build_loader(config, batch_size=args.batch)
            batches = max(1, int(0.98 * n) // (args.seq_len * args.batch))
            it = iter(loader)
            next(it)  # opening files and loading the tokenizer are not throughput
            start = time.perf_counter()
            for _ in range(batches - 1):
                next(it)
            elapsed = time.perf_counter() - start
            pipe_rates.append((batches - 1) * args.batch * args.seq_len / elapsed)

    raw, pipe = max(raw_rates), max(pipe_rates)
    print(
        f"{len(docs)} documents, {n:,} tokens, tokenizer {args.tokenizer}, "
        f"batches {args.batch} x {args.seq_len}, best of {args.repeats}\n"
    )
    print(f"{'row':<44} {'tokens/s':>12} {'ratio':>8}")
    print("-" * 66)
    print(f"{'raw encode (in memory)':<44} {raw:>12,.0f} {1.0:>8.2f}")
    print(f"{'pipeline parquet->tokens->packed batches':<44} {pipe:>12,.0f} {pipe / raw:>8.2f}")
    print(
        f"{'one GH200, paper 1.1B (5x4096 / 0.56 s)':<44} {GH200_TOKENS_PER_S:>12,.0f} "
        f"{GH200_TOKENS_PER_S / raw:>8.2f}"
    )
    print(f"\npipeline / raw encode: {pipe / raw:.2f} (target >= 0.80)")
    print(f"pipeline / one GH200's consumption: {pipe / GH200_TOKENS_PER_S:.0f}x (target >= 50x)")


if __name__ == "__main__":
    main()
