"""How long training stands still per checkpoint: synchronous against asynchronous saves.

    python -m scripts.bench.checkpoint                          # tiny model, CPU
    python -m scripts.bench.checkpoint --preset paper_1b --device cuda

Both rows save the same model and AdamW state (fp32 weights and both moments, as the trainer's
checkpoints) with the trainer's ``CheckpointWriter``. "stall" is the time ``save`` blocks the
training loop: the whole write when synchronous; for asynchronous saves, staging the state into
CPU memory plus the small per-rank files, while the write itself runs in the background
("write" is the time until the checkpoint is published). Medians over ``--repeats`` saves.
Then the cost of the manifest (``training.checkpoint.integrity``): checksumming the files a
save wrote (part of the synchronous stall; in the background thread for asynchronous saves) and
verifying them on load, timed on the last checkpoint, against the synchronous stall.
Results are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from model.presets import available_presets
from scripts.common import markdown


def measure(args: argparse.Namespace, asynchronous: bool) -> dict:
    from model import Llama
    from model.presets import load_preset
    from training.checkpoint import CheckpointWriter
    from training.optim import OptimConfig, build_optimizer
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
    env = Env(0, 1, 0, device)
    with tempfile.TemporaryDirectory() as run_dir:
        writer = CheckpointWriter(run_dir, env, keep=1, asynchronous=asynchronous)
        for step in range(1, args.repeats + 1):
            started = time.perf_counter()
            writer.save(step, model, optimizer, {"step": step}, {}, "")
            stalls.append(time.perf_counter() - started)
            writer.wait()
            writes.append(time.perf_counter() - started)
        checksum_s, verify_s, on_disk = manifest_cost(Path(run_dir), env, args.repeats)
    size = sum(p.numel() for p in model.parameters()) * 4 * 3  # weights + two moments, fp32
    return {
        "mode": "async" if asynchronous else "sync",
        "gib": size / 2**30,
        "stall_s": statistics.median(stalls),
        "write_s": statistics.median(writes),
        "checksum_s": checksum_s,
        "verify_s": verify_s,
        "disk_gib": on_disk / 2**30,
    }


def manifest_cost(run_dir: Path, env, repeats: int) -> tuple[float, float, int]:
    """(checksumming a checkpoint's files, verifying them, their bytes): medians, seconds."""
    from training.checkpoint import complete_checkpoints, integrity

    path = complete_checkpoints(run_dir)[-1]
    on_disk = sum(p.stat().st_size for p in path.iterdir())
    checksums, verifies = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        integrity.checksum_own_files(path, env.rank)
        checksums.append(time.perf_counter() - started)
        started = time.perf_counter()
        integrity.verify(path, env)
        verifies.append(time.perf_counter() - started)
    return statistics.median(checksums), statistics.median(verifies), on_disk


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
    sync = rows[0]
    print(
        f"\nmanifest: checksumming the {sync['disk_gib']:.2f} GiB a save writes takes "
        f"{sync['checksum_s']:.3f} s ({sync['disk_gib'] / sync['checksum_s']:.2f} GiB/s, "
        f"{sync['checksum_s'] / sync['stall_s']:.1%} of the synchronous stall, which includes "
        f"it); verifying them on load {sync['verify_s']:.3f} s"
    )
    return rows


if __name__ == "__main__":
    main()
