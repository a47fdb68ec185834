"""Perplexity of a run's checkpoint on held-out data.

    python -m eval.perplexity runs/quickstart-xielu                  # its own validation slice
    python -m eval.perplexity RUN --step 50 --batches 20 --batch-size 8
    python -m eval.perplexity RUN --data-paths '/data/other/*.parquet' --validation-documents 500
    torchrun --nproc_per_node=4 -m eval.perplexity RUN               # ranks split the documents

By default the run's own data config is used, so the slice is exactly the one training held
out (the same for every run of that data config). Loss is summed over every target token and
divided once, so the number does not depend on batch size or world size.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import torch
from tqdm import tqdm

from data import build_validation_loader
from training import distributed
from training.runs import load_trained_model


def evaluate(model, loader, device, max_batches: int = 0, progress: bool = True) -> dict:
    """Token-weighted mean loss over the loader (all ranks), its perplexity and token count."""
    total, count = 0.0, 0.0
    bar = tqdm(loader, desc="perplexity", unit="batch", disable=not progress)
    with torch.no_grad():
        for i, batch in enumerate(bar):
            if max_batches and i >= max_batches:
                break
            targets = batch["targets"].to(device)
            n = float((targets != -100).sum())
            if n == 0:
                continue
            loss = model(batch["inputs"].to(device), targets, batch.get("document_ids"))
            total += float(loss) * n
            count += n
    total, count = distributed.all_reduce_sum([total, count], device)
    if count == 0:
        raise ValueError("no tokens to evaluate: the validation slice is empty")
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), "tokens": int(count)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--batches", type=int, default=0, help="per rank; 0: the whole slice")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--data-paths", nargs="*", help="evaluate these local files instead")
    parser.add_argument("--validation-documents", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)

    env = distributed.init()
    try:
        model, config, step = load_trained_model(args.run_dir, args.step, env.device)
        data = config.data
        if args.data_paths:
            data = replace(data, source="local", paths=list(args.data_paths))
        if args.validation_documents is not None:
            data = replace(data, validation_documents=args.validation_documents)
        loader = build_validation_loader(data, args.batch_size, env.rank, env.world_size)
        result = evaluate(model, loader, env.device, args.batches, progress=env.is_main)
        result = {"run_dir": str(args.run_dir), "step": step, **result}
        if env.is_main:
            if args.json:
                print(json.dumps(result))
            else:
                print(
                    f"{args.run_dir} step {step}: loss {result['loss']:.4f}, perplexity "
                    f"{result['perplexity']:.2f} over {result['tokens']:,} tokens"
                )
        return result
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    main()
