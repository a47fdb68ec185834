"""What the optimizer's step costs inside a training step: AdamW, Muon and NorMuon side by side, on
1 or more ranks (FSDP2 from 2 on, gloo on a CPU, NCCL on GPUs).

    python -m scripts.bench.optimizer_step                      # CPU: 1, 2 and 4 gloo ranks
    python -m scripts.bench.optimizer_step --device cuda --preset paper_1b --batch 5 \\
        --seq 4096 --bf16 --ranks 1                              # a GPU: paper_1b, bf16

Each rank runs the trainer's own step (``training.step.train_step``: forward with the fused
loss, backward, FSDP2's gradient reduction, clipping, the update), on the same random tokens,
with the optimizer built as the trainer builds it (``training.optim.build_optimizer``; Muon's
matrices gathered to their owner ranks under FSDP2, ``training.muon.exchange``). The step is
timed from its start to the end of ``optimizer.step()``; the optimizer's part from the moment
the update is decided (after clipping) to the end of ``optimizer.step()``, every rank waiting
for the others at both ends so that a rank's wait in a collective is counted where it happens.
Medians over the timed steps on rank 0, printed as the optimizer's fraction of the step with
the ratio to AdamW's step at the same world size. Printed, never asserted; the rows, card and
date belong in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from itertools import repeat

import torch
import torch.distributed as dist

OPTIMIZERS = ("adamw", "muon", "normuon")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_initialized():
        dist.barrier()


def measure(rank: int, world: int, args: argparse.Namespace, store: str, out: dict) -> None:
    """One rank's timings of ``args.steps`` steps under each optimizer; rank 0 fills ``out``."""
    from model import Llama
    from model.presets import load_preset
    from training.optim import OptimConfig, build_optimizer
    from training.runtime.distributed import Env
    from training.runtime.parallelize import ParallelConfig, parallelize
    from training.step import train_step

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    overrides = {"max_seq_len": args.seq}
    if args.preset == "tiny":
        overrides.update(dim=args.dim, n_layers=args.layers, gated_hidden=4 * args.dim)
    config = load_preset(args.preset, activation=args.activation, **overrides)
    if config.vocab_size is None:  # the tiny preset takes a tokenizer's
        config = load_preset(
            args.preset, activation=args.activation, vocab_size=args.vocab_size, **overrides
        )
    plan = ParallelConfig(
        strategy="fsdp" if world > 1 else "none", precision="bf16" if args.bf16 else "fp32"
    )
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=generator)
    batch = {"inputs": tokens[:, :-1].to(device), "targets": tokens[:, 1:].to(device)}
    marks: dict[str, float] = {}

    def decided(loss_sum, grad_norm) -> bool:
        """Called after clipping, right before ``optimizer.step()``."""
        _synchronize(device)
        marks["decided"] = time.perf_counter()
        return True

    for name in OPTIMIZERS:
        torch.manual_seed(0)
        model = Llama(config).to(device)
        training = parallelize(model, Env(rank, world, rank, device), plan)
        optimizer = build_optimizer(model, OptimConfig(name=name), device)
        steps, updates = [], []
        for i in range(args.warmup + args.steps):
            _synchronize(device)
            start = time.perf_counter()
            train_step(training, optimizer, repeat(batch), 1, 1.0, should_update=decided)
            _synchronize(device)
            end = time.perf_counter()
            if i >= args.warmup:
                steps.append(end - start)
                updates.append(end - marks["decided"])
        if rank == 0:
            out[name] = (statistics.median(steps), statistics.median(updates))
        del model, training, optimizer
    if world > 1:
        dist.destroy_process_group()


def _rank_main(rank: int, world: int, args, store: str, queue) -> None:
    out: dict = {}
    measure(rank, world, args, store, out)
    if rank == 0:
        queue.put(out)


def at_world_size(world: int, args: argparse.Namespace) -> dict:
    if world == 1:
        out: dict = {}
        measure(0, 1, args, "", out)
        return out
    context = torch.multiprocessing.get_context("spawn")
    queue = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        torch.multiprocessing.start_processes(
            _rank_main, args=(world, args, store, queue), nprocs=world, start_method="spawn"
        )
    return queue.get()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--dim", type=int, default=128, help="tiny preset only")
    parser.add_argument("--layers", type=int, default=4, help="tiny preset only")
    parser.add_argument("--vocab-size", type=int, default=8192, help="where the preset has none")
    parser.add_argument("--activation", default="xielu")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args(argv)
    rows = []
    print("| ranks | optimizer | step ms | optimizer ms | optimizer / step | step / AdamW's |")
    print("|---|---|---|---|---|---|")
    for world in args.ranks:
        timings = at_world_size(world, args)
        adamw_step = timings["adamw"][0]
        for name in OPTIMIZERS:
            step, update = timings[name]
            row = {"ranks": world, "optimizer": name, "step_ms": 1e3 * step}
            row.update(update_ms=1e3 * update, fraction=update / step, vs_adamw=step / adamw_step)
            rows.append(row)
            print(
                f"| {world} | {name} | {row['step_ms']:.1f} | {row['update_ms']:.1f} | "
                f"{row['fraction']:.1%} | {row['vs_adamw']:.2f} |"
            )
    return rows


if __name__ == "__main__":
    main()
