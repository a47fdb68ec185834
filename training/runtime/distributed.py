"""Everything that touches torch.distributed: process group, device, collectives.

The model never calls torch.distributed; the trainer asks this module for rank and world size,
and ``training.runtime.parallelize`` for the wrapped model. Single-process runs (no ``torchrun``)
need no process group at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def adopt_slurm_tasks(env: dict) -> None:
    """Fill torchrun's variables from SLURM's when the processes were started by ``srun`` (or
    by the submitit launcher) with one task per GPU instead of by torchrun.

    Only inside an ``srun`` step of several tasks (``SLURM_STEP_NUM_TASKS`` > 1, which srun
    sets for the step's tasks and sbatch does not set for the batch script): the batch script
    itself, or an ``salloc`` shell, sees the job's ``SLURM_NTASKS`` too, and a plain
    ``python train.py`` there would become rank 0 of N, waiting for peers that never come.
    """
    if "RANK" in env or int(env.get("SLURM_STEP_NUM_TASKS", "1")) <= 1:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env["SLURM_STEP_NUM_TASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in env:
        import subprocess

        nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "localhost")
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        ).stdout.split()
        env["MASTER_ADDR"] = hosts[0]
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))


def init(timeout_s: float | None = None) -> Env:
    """Read torchrun's (or SLURM's) environment; start the process group (nccl on CUDA, gloo
    on CPU). ``timeout_s``: how long a collective may wait for a rank before it fails, so a
    rank that hangs (rather than dies: torchrun stops the others then) ends the job."""
    adopt_slurm_tasks(os.environ)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        try:
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                device_id=device if device.type == "cuda" else None,
                timeout=timedelta(seconds=timeout_s) if timeout_s else None,
            )
        except (RuntimeError, dist.DistError) as error:
            where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            raise RuntimeError(
                f"rank {rank} of {world}: the process group at {where} did not form ({error}). "
                "Were all the ranks started? Under SLURM, ranks come from one srun step "
                "(srun -n N, or torchrun per node as slurm/train.sbatch does); a plain "
                "`python train.py` runs a single process."
            ) from error
    return Env(rank, world, local, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum floats over ranks (identity when single-process), in fp64."""
    return _all_reduce(values, device, "SUM")


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    return _all_reduce(values, device, "MAX")


def _all_reduce(values: list[float], device: torch.device, op: str) -> list[float]:
    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t.tolist()


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank; ``[value]`` alone."""
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def any_rank(flag: bool, device: torch.device) -> bool:
    return all_reduce_sum([float(flag)], device)[0] > 0
