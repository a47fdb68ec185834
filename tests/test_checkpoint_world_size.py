"""A checkpoint written by one world size and layout loads on another, every tensor bit for bit.

For each of {DDP, FSDP2} x {fp32, bf16}: 2 gloo processes train and save, 1 process loads that
checkpoint, trains on and saves, 2 processes load again (2 -> 1 -> 2); each phase is one spawn
that goes through the four in turn. After each load, the
model and optimizer are gathered whole and compared with the checkpoint as read independently
of the trainer (DCP's own conversion to one ``torch.save`` file). Under bf16 FSDP2 the
optimizer has more param groups on 2 processes than on 1 (a role split by layout), which a
checkpoint keyed by group index could not survive.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from model import Llama, ModelConfig
from training import checkpoint
from training.optim import OptimConfig, build_optimizer
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize
from training.step import train_step

pytestmark = pytest.mark.slow

MODEL = ModelConfig(vocab_size=128, dim=32, n_layers=2, n_heads=2, gated_hidden=64, max_seq_len=16)
GLOBAL_BATCH = 4


def build(env: Env, parallelism: str, precision: str):
    torch.manual_seed(0)
    plan = ParallelConfig(strategy=parallelism, precision=precision)
    model = parallelize(Llama(MODEL), env, plan)
    return model, build_optimizer(model.bare, OptimConfig(lr=1e-2), env.device)


def train(model, optimizer, env: Env, steps: int, seed: int) -> None:
    """``steps`` optimizer steps on random tokens, each rank its share of the global batch."""
    for step in range(steps):
        generator = torch.Generator().manual_seed(seed + step)
        tokens = torch.randint(0, MODEL.vocab_size, (GLOBAL_BATCH, 9), generator=generator)
        per_rank = GLOBAL_BATCH // env.world_size
        mine = tokens[env.rank * per_rank : (env.rank + 1) * per_rank]
        batches = iter(
            [
                {"inputs": mine[i : i + 1, :-1], "targets": mine[i : i + 1, 1:]}
                for i in range(per_rank)
            ]
        )
        train_step(model, optimizer, batches, per_rank, grad_clip=1.0)


def gathered(model, optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the model and optimizer, whole, by the key DCP saves it under."""
    options = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    model_state, optim_state = get_state_dict(model.wrapped, optimizer, options=options)
    out = {f"model.{k}": v for k, v in model_state.items()}
    out.update({f"optim.{k}": v for k, v in optim_state.items() if torch.is_tensor(v)})
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
        for k, v in out.items()
    }


def saved(path: Path, into: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, read by DCP's converter rather than the trainer's loader."""
    dcp_to_torch_save(path, into)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        elif torch.is_tensor(node):
            flat[prefix[:-1]] = node

    walk("", torch.load(into, weights_only=False))
    return flat


COMBINATIONS = [(p, q) for p in ("ddp", "fsdp") for q in ("fp32", "bf16")]


def phase(rank: int, world_size: int, root: str, step: int) -> None:
    """For each combination in its own run directory: load the newest checkpoint (if any),
    compare, train 2 steps, save at ``step``. One process group serves the four."""
    import torch.distributed as dist

    if world_size > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{root}/rendezvous-{step}", rank=rank, world_size=world_size
        )
    env = Env(rank=rank, world_size=world_size, local_rank=0, device=torch.device("cpu"))
    for parallelism, precision in COMBINATIONS:
        run_dir = Path(root) / f"{parallelism}-{precision}"
        model, optimizer = build(env, parallelism, precision)
        found = checkpoint.load_latest(run_dir, model.wrapped, optimizer, env)
        report = {"groups": len(optimizer.param_groups)}
        if found is not None:
            ours = gathered(model, optimizer)
            if rank == 0:
                theirs = saved(found.path, run_dir / f"converted-{step}.pt")
                report["keys_equal"] = sorted(ours) == sorted(theirs)
                report["differ"] = [
                    k for k in theirs if k in ours and not torch.equal(ours[k], theirs[k])
                ]
                report["changed_settings"] = found.changed_settings
        train(model, optimizer, env, 2, seed=step)
        writer = checkpoint.CheckpointWriter(run_dir, env, keep=3, asynchronous=False)
        writer.save(step, model.wrapped, optimizer, {"step": step, "tokens": 0}, {}, "")
        if rank == 0:
            (run_dir / f"report-{step}.json").write_text(json.dumps(report))
        # DDP's reducer holds the gloo group: freed after destroy_process_group it can hang the
        # process at exit (training.loop.Trainer.release_model says how)
        del model, optimizer, writer, found
        gc.collect()
    if world_size > 1:
        dist.destroy_process_group()


def test_two_then_one_then_two_processes_load_every_tensor_bit_for_bit(tmp_path):
    for world_size, step in ((2, 2), (1, 4), (2, 6)):
        torch.multiprocessing.spawn(
            phase, args=(world_size, str(tmp_path), step), nprocs=world_size
        )
    for parallelism, precision in COMBINATIONS:
        run_dir = tmp_path / f"{parallelism}-{precision}"
        first, one, two = (
            json.loads((run_dir / f"report-{step}.json").read_text()) for step in (2, 4, 6)
        )
        where = (parallelism, precision)
        for report in (one, two):
            assert report["keys_equal"] and report["differ"] == [], where
            assert report["changed_settings"] == [], where  # the same config: nothing to report
        if (parallelism, precision) == ("fsdp", "bf16"):  # the layout that splits a group
            assert first["groups"] == two["groups"] > one["groups"]
        names = [p.name for p in checkpoint.complete_checkpoints(run_dir)]
        assert names == ["step_000002", "step_000004", "step_000006"], where
