"""Sample text from a run's checkpoint (any activation, any tokenizer), with a KV cache.

    python -m eval.generate runs/quickstart-xielu --prompt "The list type"
    python -m eval.generate RUN --prompt "def " --prompt "import" --temperature 0   # greedy
    python -m eval.generate RUN --prompts-file prompts.txt --batch-size 16 --json > out.jsonl
    python -m eval.generate RUN --prompt "Lists" --temperature 0.8 --top-k 50 --top-p 0.95 \\
        --seed 1 --max-new-tokens 200 --step 500 --device cpu

A prompt starts where a training document starts, right after an EOS (and a BOS when the run's
tokenizer adds one), so the model continues it as the beginning of a document. Sampling is
seeded (``--seed``, default 0): the same command prints the same text. The sampling loop is
``model/sampling.py``; prompts in one batch decode together.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from model.sampling import (
    Generation,
    SamplingConfig,
    check_prompt_lengths,
    document_start,
    generate,
)


def prompt_ids(tokenizer, text: str, add_bos: bool) -> list[int]:
    """``text`` as the start of a training document: after an EOS, and a BOS if the run adds one."""
    bos = tokenizer.bos_id if add_bos else None
    return document_start(tokenizer.encode(text), tokenizer.eos_id, bos)


def read_prompts(prompts: list[str], prompts_file: Path | None) -> list[str]:
    """``--prompt`` values, then one prompt per non-empty line of ``--prompts-file``."""
    out = list(prompts)
    if prompts_file is not None:
        lines = prompts_file.read_text(encoding="utf-8").splitlines()
        out += [line for line in lines if line.strip()]
    return out


def generate_texts(
    model,
    tokenizer,
    texts: list[str],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int | None = 0,
    add_bos: bool = False,
    batch_size: int = 8,
    progress: bool = False,
) -> list[tuple[str, Generation]]:
    """Each prompt's decoded continuation and its ``Generation`` (ids, why it stopped)."""
    ids = [prompt_ids(tokenizer, text, add_bos) for text in texts]
    check_prompt_lengths([len(i) for i in ids], model.config.max_seq_len)  # before any work
    out = []
    bar = tqdm(total=len(texts), desc="generate", unit="prompt", disable=not progress)
    for start in range(0, len(texts), batch_size):
        chunk = ids[start : start + batch_size]
        # each batch its own seed, so a prompt's text depends on its batch, not on those before
        batch_seed = None if seed is None else seed + start
        for generation in generate(
            model,
            chunk,
            max_new_tokens,
            sampling,
            eos_id=tokenizer.eos_id,
            seed=batch_seed,
            vocab_limit=tokenizer.vocab_size,
        ):
            out.append((tokenizer.decode(generation.tokens), generation))
        bar.update(len(chunk))
    bar.close()
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    parser.add_argument("--prompt", action="append", default=[], help="repeat for several")
    parser.add_argument("--prompts-file", type=Path, help="one prompt per line")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling; 1: off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="default: cuda when there is a GPU, else cpu",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    parser.add_argument("--json", action="store_true", help="print one JSON line per prompt")
    args = parser.parse_args(argv)

    texts = read_prompts(args.prompt, args.prompts_file)
    if not texts:
        parser.error("give at least one --prompt or a --prompts-file")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    except ValueError as error:
        parser.error(str(error))

    from data import load_tokenizer
    from training.checkpoint import load_trained_model

    model, config, step = load_trained_model(args.run_dir, args.step, args.device)
    tokenizer = load_tokenizer(config.data.tokenizer)
    started = time.perf_counter()
    try:
        results = generate_texts(
            model,
            tokenizer,
            texts,
            args.max_new_tokens,
            sampling,
            args.seed,
            config.data.tokenizer.add_bos,
            args.batch_size,
            progress=len(texts) > args.batch_size,
        )
    except ValueError as error:  # e.g. a prompt longer than the model's context
        sys.exit(f"eval.generate: {error}")
    seconds = time.perf_counter() - started

    records = []
    for text, (completion, generation) in zip(texts, results, strict=True):
        record = {
            "prompt": text,
            "completion": completion,
            "new_tokens": len(generation.tokens),
            "finish_reason": generation.finish_reason,
        }
        records.append(record)
        if args.json:
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(f"--- {record['new_tokens']} new tokens, stopped at {generation.finish_reason}")
            print(text + completion)
    new_tokens = sum(r["new_tokens"] for r in records)
    print(
        f"{args.run_dir} step {step} ({config.model.activation}, {tokenizer.name} tokenizer): "
        f"{len(records)} prompt(s), {new_tokens} new tokens in {seconds:.1f} s on {args.device}",
        file=sys.stderr if args.json else sys.stdout,
    )
    return records


if __name__ == "__main__":
    main()
