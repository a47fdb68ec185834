"""A checkpoint written by one world size and layout loads on another, every tensor bit for bit.

For each of {DDP, FSDP2} x {fp32, bf16}: 2 gloo processes train and save, 1 process loads that
checkpoint, trains on and saves, 2 processes load again (2 -> 1 -> 2). After each load, the
model and optimizer are gathered whole and compared with the checkpoint as read independently
of the trainer (DCP's own conversion to one ``torch.save`` file). Under bf16 FSDP2 the
optimizer has more param groups on 2 processes than on 1 (a role split by layout), which a
checkpoint keyed by group index could not survive (issue 35).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from model import Llama, ModelConfig
from training import checkpoint
from training.config import OptimConfig, TrainerConfig
from training.optim import build_optimizer
from training.runtime.distributed import Env
from training.runtime.parallelize import parallelize, plan_from_config
from training.step import train_step

pytestmark = pytest.mark.slow

MODEL = ModelConfig(vocab_size=128, dim=32, n_layers=2, n_heads=2, gated_hidden=64, max_seq_len=16)
GLOBAL_BATCH = 4


def build(env: Env, parallelism: str, precision: str):
    torch.manual_seed(0)
    plan = plan_from_config(TrainerConfig(parallelism=parallelism, precision=precision), env.device)
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


def phase(rank: int, world_size: int, run_dir: str, parallelism: str, precision: str, step: int):
    """Load the newest checkpoint (if any), compare, train 2 steps, save at ``step``."""
    import torch.distributed as dist

    if world_size > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{run_dir}/rendezvous-{step}",
            rank=rank,
            world_size=world_size,
        )
    env = Env(rank=rank, world_size=world_size, local_rank=0, device=torch.device("cpu"))
    model, optimizer = build(env, parallelism, precision)
    found = checkpoint.load_latest(run_dir, model.wrapped, optimizer, env)
    report = {"groups": len(optimizer.param_groups)}
    if found is not None:
        ours = gathered(model, optimizer)
        if rank == 0:
            theirs = saved(found.path, Path(run_dir) / f"converted-{step}.pt")
            report["keys_equal"] = sorted(ours) == sorted(theirs)
            report["differ"] = [
                k for k in theirs if k in ours and not torch.equal(ours[k], theirs[k])
            ]
            report["changed_settings"] = found.changed_settings
    train(model, optimizer, env, 2, seed=step)
    writer = checkpoint.CheckpointWriter(run_dir, env, keep=3, asynchronous=False)
    writer.save(step, model.wrapped, optimizer, {"step": step, "tokens": 0}, {}, "")
    if rank == 0:
        (Path(run_dir) / f"report-{step}.json").write_text(json.dumps(report))
    if world_size > 1:
        dist.destroy_process_group()


def run_phase(world_size: int, run_dir: Path, parallelism: str, precision: str, step: int) -> dict:
    args = (world_size, str(run_dir), parallelism, precision, step)
    torch.multiprocessing.spawn(phase, args=args, nprocs=world_size)
    return json.loads((run_dir / f"report-{step}.json").read_text())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_then_one_then_two_processes_load_every_tensor_bit_for_bit(
    parallelism, precision, tmp_path
):
    first = run_phase(2, tmp_path, parallelism, precision, step=2)
    one = run_phase(1, tmp_path, parallelism, precision, step=4)
    two = run_phase(2, tmp_path, parallelism, precision, step=6)
    for report in (one, two):
        assert report["keys_equal"] and report["differ"] == []
        assert report["changed_settings"] == []  # the same config: nothing to report
    if parallelism == "fsdp" and precision == "bf16":  # the layout that splits a role's group
        assert first["groups"] == two["groups"] > one["groups"]
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == [
        "step_000002",
        "step_000004",
        "step_000006",
    ]
