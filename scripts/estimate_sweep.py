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

A Muon job (``optim.name=muon``) also pays, every step, Newton-Schulz's FLOPs on every Muon
matrix (``training.muon.newton_schulz_flops``; spread over the job's ranks, at the same MFU)
and its exchange of the matrices (``training.muon.exchange_elements``: the busiest rank's fp32
elements, at ``--bandwidth`` bytes per second per GPU, not overlapped with compute): the
``Muon GPU-hours`` column, included in the total. A job's ranks are its launcher's ``nodes`` x
``tasks_per_node``.
"""

from __future__ import annotations

import argparse
import math

from data import load_tokenizer
from model import count_parameters, training_flops_per_token
from scripts.common import markdown
from training.batch_ramp import BatchPlan
from training.instruments.metrics import PEAK_BF16_FLOPS
from training.muon import exchange_elements, newton_schulz_flops
from training.parameter_groups import hidden_matrix_shapes
from training.sweeps import expand, load_sweep, resolve, with_unread_paths

# ReLU² at paper_1b, one H100, 2026-11-27: scripts.bench.throughput --preset paper_1b --batch 5
# --seq 4096 --bf16 --compile blocks --checkpointing selective (docs/performance.md, training table)
MEASURED_MFU = 0.524
MEASURED_ON = "ReLU² at paper_1b on one H100, 2026-11-27"
# bytes per second a GPU of a GH200 node sends and receives across nodes: one 200 Gb/s
# Slingshot-11 NIC per GH200; the GPUs of one node talk faster (NVLink), so this is an upper
# bound on a one-node job's exchange time
GH200_NETWORK_BYTES_S = 25e9


def job_cost(overrides: list[str], ranks: int = 1) -> dict:
    """Parameters, tokens and training FLOPs of one job on ``ranks`` GPUs; under Muon, its
    Newton-Schulz FLOPs and the busiest rank's exchanged elements, per step."""
    config = resolve(overrides)
    model = config.model.with_vocab_from_tokenizer(load_tokenizer(config.data.tokenizer).vocab_size)
    params = count_parameters(model).total
    tokens = BatchPlan(config).tokens_before(config.trainer.steps)  # a batch ramp's too
    flops = training_flops_per_token(model, config.data.seq_len) * tokens
    cost = {
        "model": f"{model.dim}x{model.n_layers}",
        "activation": model.activation,
        "params": params,
        "tokens": tokens,
        "flops": flops,
        "steps": config.trainer.steps,
        "ranks": ranks,
        "muon_flops_per_step": 0,
        "muon_elements_per_step": 0,
    }
    if config.optim.matrix_rate is not None:  # Muon: orthogonalized matrices, exchanged
        shapes = hidden_matrix_shapes(model)
        cost["muon_flops_per_step"] = sum(newton_schulz_flops(*shape) for shape in shapes)
        cost["muon_elements_per_step"] = max(exchange_elements(shapes, ranks))
    return cost


def muon_seconds(job: dict, rate: float, bandwidth: float) -> float:
    """Wall seconds Muon adds to a job: each step's Newton-Schulz FLOPs over its ranks at
    ``rate`` FLOP/s each, plus the busiest rank's fp32 exchange at ``bandwidth`` B/s."""
    compute = job["muon_flops_per_step"] / job["ranks"] / rate
    exchange = job["muon_elements_per_step"] * 4 / bandwidth
    return job["steps"] * (compute + exchange)


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
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=GH200_NETWORK_BYTES_S,
        help="bytes/s a GPU exchanges Muon's matrices at (default: a GH200's network link)",
    )
    args = parser.parse_intermixed_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be a positive number of GPUs, got {args.gpus}")
    if not 0 < args.mfu <= 1:  # NaN fails it too
        parser.error(f"--mfu must lie in (0, 1], got {args.mfu}")
    if not 0 < args.peak < math.inf:
        parser.error(f"--peak must be a positive finite FLOP/s, got {args.peak}")
    if not 0 < args.bandwidth < math.inf:
        parser.error(f"--bandwidth must be a positive finite B/s, got {args.bandwidth}")
    rate = args.mfu * args.peak
    extra = with_unread_paths(args.overrides)
    sweep = load_sweep(args.sweep)
    launcher = sweep.get("launcher", {})
    ranks = launcher.get("nodes", 1) * launcher.get("tasks_per_node", 1)
    jobs = [job_cost(job, ranks) for job in expand(sweep, extra)]
    rows, total = [], 0.0
    for job in jobs:
        muon_hours = muon_seconds(job, rate, args.bandwidth) * job["ranks"] / 3600
        gpu_hours = job["flops"] / rate / 3600 + muon_hours
        total += gpu_hours
        rows.append(
            [
                job["model"],
                job["activation"],
                f"{job['params'] / 1e6:.0f}M",
                f"{job['tokens'] / 1e9:.2f}B",
                f"{job['tokens'] / job['params']:.1f}",
                f"{job['flops']:.2e}",
                f"{muon_hours:.1f}",
                f"{gpu_hours:.1f}",
            ]
        )
    header = ["model", "activation", "params", "tokens", "tokens/param", "FLOPs"]
    header += ["Muon GPU-hours", "GPU-hours"]
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
