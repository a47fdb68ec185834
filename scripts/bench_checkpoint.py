"""How long training stands still per checkpoint: synchronous against asynchronous saves.

    python -m scripts.bench_checkpoint                          # tiny model, CPU
    python -m scripts.bench_checkpoint --preset paper_1b --device cuda

Both rows save the same model and AdamW state (fp32 weights and both moments, as the trainer's
checkpoints) with the trainer's ``CheckpointWriter``. "stall" is the time ``save`` blocks the
training loop: the whole write when synchronous; for asynchronous saves, staging the state into
CPU memory plus the small per-rank files, while the write itself runs in the background
("write" is the time until the checkpoint is published). Medians over ``--repeats`` saves.
Results are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from model.presets import available_presets
from scripts.common import markdown


def measure(args: argparse.Namespace, asynchronous: bool) -> dict:
    from model import Llama
    from model.presets import load_preset
    from training.checkpoint import CheckpointWriter
    from training.config import OptimConfig
    from training.optim import build_optimizer
    from training.runtime.distributed import Env

    device = torch.device(args.device)
    config = load_preset(
        args.preset, **({"vocab_size": args.vocab_size} if args.vocab_size else {})
    )
    model = Llama(config).to(device)
    optimizer = build_optimizer(model, OptimConfig(), device)
    for p in model.parameters():  # one step, so AdamW holds its two moments
        p.grad = torch.zeros_like(p)
    optimizer.step()
    stalls, writes = [], []
    with tempfile.TemporaryDirectory() as run_dir:
        writer = CheckpointWriter(run_dir, Env(0, 1, 0, device), keep=1, asynchronous=asynchronous)
        for step in range(1, args.repeats + 1):
            started = time.perf_counter()
            writer.save(step, model, optimizer, {"step": step}, {}, "")
            stalls.append(time.perf_counter() - started)
            writer.wait()
            writes.append(time.perf_counter() - started)
    size = sum(p.numel() for p in model.parameters()) * 4 * 3  # weights + two moments, fp32
    return {
        "mode": "async" if asynchronous else "sync",
        "gib": size / 2**30,
        "stall_s": statistics.median(stalls),
        "write_s": statistics.median(writes),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", choices=available_presets())
    parser.add_argument("--vocab-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.preset == "tiny" and args.vocab_size is None:
        args.vocab_size = 32768
    rows = [measure(args, asynchronous) for asynchronous in (False, True)]
    base = rows[0]["stall_s"]
    body = [
        [
            r["mode"],
            f"{r['gib']:.2f}",
            f"{r['stall_s']:.3f}",
            f"{r['stall_s'] / base:.3f}",
            f"{r['write_s']:.3f}",
        ]
        for r in rows
    ]
    header = ["save", "state GiB", "stall s", "x sync", "until published s"]
    print(f"{args.preset} on {args.device}, median of {args.repeats} saves\n")
    print("\n".join(markdown(header, body)))
    return rows


if __name__ == "__main__":
    main()
