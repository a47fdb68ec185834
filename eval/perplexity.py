"""Perplexity of a run's checkpoint on held-out data.

    python -m eval.perplexity runs/quickstart-xielu                  # its own validation slice
    python -m eval.perplexity RUN --step 50 --batches 20 --batch-size 8 --device cpu
    python -m eval.perplexity RUN --data-paths '/data/other/*.parquet' --validation-documents 500
    torchrun --nproc_per_node=4 -m eval.perplexity RUN               # ranks split the documents

By default the run's own data config is used, so the slice is exactly the one training held
out (the same for every run of that data config), all of it unless ``--batches`` says
otherwise. The loss is ``training.instruments.validation``'s, the trainer's own, so it equals the
run's logged ``val/loss`` when the run validated on the whole slice too
(``validation.batches=0``); a run with ``validation.batches=N`` logs the loss of the first N
batches per rank, and says so (``val/tokens``, and the closing line). It does not depend on batch
size or world size.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace

import torch

from data import build_validation_loader
from training.checkpoint import load_trained_model
from training.instruments.validation import validation_loss
from training.runtime import distributed
from training.runtime.parallelize import parallelize


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--batches", type=int, default=0, help="per rank; 0: the whole slice")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward")
    parser.add_argument(
        "--device", help="default: the GPU when there is one (each rank its own), else cpu"
    )
    parser.add_argument("--data-paths", nargs="*", help="evaluate these local files instead")
    parser.add_argument("--validation-documents", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)

    env = distributed.init()
    if args.device:
        env = replace(env, device=torch.device(args.device))
    try:
        model, config, step = load_trained_model(args.run_dir, args.step, env.device)
        data = config.data
        if args.data_paths:
            data = replace(data, source="local", paths=list(args.data_paths))
        if args.validation_documents is not None:
            data = replace(data, validation_documents=args.validation_documents)
        loader = build_validation_loader(data, args.batch_size, env.rank, env.world_size)
        batches = itertools.islice(loader, args.batches or None)
        shape = (args.batch_size, data.seq_len)
        # the run's precision, an unwrapped copy per rank
        model = parallelize(model, env, config.parallel.for_evaluation())
        result = validation_loss(model, batches, env.device, shape, model.autocast, env.is_main)
        if result["tokens"] == 0:
            raise SystemExit("no tokens to evaluate: the validation slice is empty")
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
