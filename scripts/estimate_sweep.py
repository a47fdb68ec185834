"""How long a sweep takes: its jobs' FLOPs over a measured throughput, before submitting it.

    python -m scripts.estimate_sweep ladder_h100 --gpus 1
    python -m scripts.estimate_sweep ladder_gh200 --gpus 16 --mfu 0.4

Each job of ``configs/sweep/<name>.yaml`` is composed as ``train.py`` would compose it; its
training FLOPs are ``training_flops_per_token`` (6 x matmul parameters + attention) x the run's
tokens (steps x global batch x sequence length, summed stage by stage under a batch ramp).
The default MFU is ReLU²'s at paper_1b on one H100 (:data:`MEASURED_MFU`, the training table of
docs/performance.md, which a test reads): one GPU with no FSDP communication, and smaller models
reach less of the peak, so the hours are a lower bound, for the small rungs and for multi-node
runs; ``--mfu`` sets another. GH200 is counted at the H100 SXM peak (the same Hopper GPU).
"""

from __future__ import annotations

import argparse
import math

from data import load_tokenizer
from model import count_parameters, training_flops_per_token
from scripts.common import markdown
from training.batch_ramp import BatchPlan
from training.instruments.metrics import PEAK_BF16_FLOPS
from training.sweeps import expand, load_sweep, resolve, with_unread_paths

# ReLU² at paper_1b, one H100, 2026-11-27: scripts.bench.throughput --preset paper_1b --batch 5
# --seq 4096 --bf16 --compile blocks --checkpointing selective (docs/performance.md, training table)
MEASURED_MFU = 0.524
MEASURED_ON = "ReLU² at paper_1b on one H100, 2026-11-27"


def job_cost(overrides: list[str]) -> dict:
    """Parameters, tokens and training FLOPs of one job."""
    config = resolve(overrides)
    model = config.model.with_vocab_from_tokenizer(load_tokenizer(config.data.tokenizer).vocab_size)
    params = count_parameters(model).total
    tokens = BatchPlan(config).tokens_before(config.trainer.steps)  # a batch ramp's too
    flops = training_flops_per_token(model, config.data.seq_len) * tokens
    return {
        "model": f"{model.dim}x{model.n_layers}",
        "activation": model.activation,
        "params": params,
        "tokens": tokens,
        "flops": flops,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep")
    parser.add_argument("overrides", nargs="*", help="appended to every job")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the whole sweep shares")
    parser.add_argument("--mfu", type=float, default=MEASURED_MFU, help=f"default: {MEASURED_ON}")
    parser.add_argument(
        "--peak", type=float, default=PEAK_BF16_FLOPS["H100"], help="FLOP/s per GPU"
    )
    args = parser.parse_intermixed_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be a positive number of GPUs, got {args.gpus}")
    if not 0 < args.mfu <= 1:  # NaN fails it too
        parser.error(f"--mfu must lie in (0, 1], got {args.mfu}")
    if not 0 < args.peak < math.inf:
        parser.error(f"--peak must be a positive finite FLOP/s, got {args.peak}")
    rate = args.mfu * args.peak
    extra = with_unread_paths(args.overrides)
    jobs = [job_cost(job) for job in expand(load_sweep(args.sweep), extra)]
    rows, total = [], 0.0
    for job in jobs:
        gpu_hours = job["flops"] / rate / 3600
        total += gpu_hours
        rows.append(
            [
                job["model"],
                job["activation"],
                f"{job['params'] / 1e6:.0f}M",
                f"{job['tokens'] / 1e9:.2f}B",
                f"{job['tokens'] / job['params']:.1f}",
                f"{job['flops']:.2e}",
                f"{gpu_hours:.1f}",
            ]
        )
    header = ["model", "activation", "params", "tokens", "tokens/param", "FLOPs", "GPU-hours"]
    print("\n".join(markdown(header, rows)))
    measured = f" ({MEASURED_ON})" if args.mfu == MEASURED_MFU else ""
    print(
        f"{len(jobs)} jobs, {total:.0f} GPU-hours at MFU {args.mfu:.3f}{measured} of "
        f"{args.peak / 1e12:.0f} TFLOP/s: {total / args.gpus:.1f} hours on {args.gpus} GPU(s), "
        "if the runs keep them all busy"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
