"""Tokenize a text source once into binary shards for ``data.source=tokenized``.

    python -m scripts.pretokenize OUT_DIR --source local --paths 'fineweb/*.parquet' \
        --tokenizer mistral_nemo --workers 16 --shard-tokens 500000000

Every document of the source, in its global order (held-out validation documents included, so
``data=tokenized`` holds out the same ones), becomes ``[BOS] ids EOS``; documents are written
in order into shards of about ``--shard-tokens`` tokens. What the documents are, and how they
are read, is the source's (``DataSource.pretokenize`` in ``data/sources/``): local fragments
(parquet row groups, jsonl files) are tokenized in parallel worker processes, results kept in
order. A progress bar counts tokens; skipped records are counted and reported at the end.

Each shard's header records the tokenizer that wrote it (``data.shards``), and a run reading
the shards with another tokenizer is refused. The shards are written into ``OUT_DIR.partial``
beside ``OUT_DIR`` and renamed ``OUT_DIR`` when all are written, so a glob over ``OUT_DIR``
never reads a mix of two runs, even if this one is killed halfway (its ``.partial`` is removed
by the next). An ``OUT_DIR`` that holds files is refused unless ``--replace`` says to replace
it whole.
"""

from __future__ import annotations

import argparse
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data import DataConfig, TokenizerConfig, available_sources, get_source, load_tokenizer
from data.shards import write_shard
from data.tokenizers import identity_of


def text_sources() -> list[str]:
    """The sources pretokenize can read (all but those that are tokens already)."""
    return [name for name in available_sources() if get_source(name).pretokenize]


def pretokenize(
    config: DataConfig, out_dir: Path, shard_tokens: int, workers: int, replace: bool = False
) -> Counter:
    """Write every document's tokens into shards in ``out_dir`` (see the module doc)."""
    if out_dir.exists() and not out_dir.is_dir():  # even with --replace: it is not shards
        raise FileExistsError(f"{out_dir} is a file, not a directory: choose a directory")
    if out_dir.exists() and any(out_dir.iterdir()) and not replace:
        raise FileExistsError(
            f"{out_dir} already holds files; a glob over it would read them with the new "
            "shards. Choose an empty directory, or pass --replace to replace it whole."
        )
    tokenizer = load_tokenizer(config.tokenizer)
    chunks = get_source(config.source).pretokenize
    if chunks is None:
        raise ValueError(
            f"data.source={config.source} cannot be pretokenized; choose one of: "
            f"{', '.join(text_sources())}"
        )
    identity = identity_of(tokenizer)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a killed run's
    partial.mkdir(parents=True)
    totals = _write_shards(config, chunks, partial, identity, shard_tokens, workers)
    _replace_whole(partial, out_dir)
    return totals


def _replace_whole(new: Path, out_dir: Path) -> None:
    """``new`` becomes ``out_dir``; the old one goes only once the new one is in place."""
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)
    new.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _write_shards(config, chunks, out_dir: Path, identity, shard_tokens: int, workers: int):
    progress = tqdm(unit="tok", unit_scale=True)
    totals, pending, shard = Counter(), [], 0

    def flush() -> None:
        nonlocal pending, shard
        if pending:
            tokens = np.concatenate(pending)
            write_shard(out_dir / f"shard_{shard:05d}.bin", tokens, identity)
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
    parser.add_argument(
        "--replace", action="store_true", help="replace OUT_DIR whole if it already holds files"
    )
    args = parser.parse_args(argv)
    config = DataConfig(
        source=args.source,
        paths=args.paths,
        text_column=args.text_column,
        hub_config=args.hub_config,
        min_int_score=args.min_int_score,
        tokenizer=TokenizerConfig(args.tokenizer, args.tokenizer_path, args.add_bos),
    )
    try:
        totals = pretokenize(config, args.out_dir, args.shard_tokens, args.workers, args.replace)
    except FileExistsError as error:
        raise SystemExit(f"pretokenize: {error}") from None
    print(", ".join(f"{k}: {v:,}" for k, v in sorted(totals.items())))


if __name__ == "__main__":
    main()
