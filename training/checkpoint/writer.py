"""Writing checkpoints, synchronously or while training goes on, and publishing each atomically.

Every checkpoint is written under ``step_N.tmp`` and renamed ``step_N`` by rank 0 only once
every rank's files are on disk, so a crash at any moment (in a synchronous write, during an
asynchronous one, or between the two) leaves the previous published checkpoint as the newest
(layout: ``training.checkpoint.layout``; loading: ``training.checkpoint.load``).

Asynchronous saves (``checkpoint.async_write``): the small per-rank files are written at
once; the model and optimizer state is copied to CPU memory (DCP's staging: training may then
change the weights) and written by a background thread through a gloo process group of its
own, so its collectives never interleave with training's. The trainer calls :meth:`poll` every
step (one all-reduce while a save is in flight) and the checkpoint is published as soon as every
rank has finished; at most one save is in flight (a new save, the end of the run and a
preemption first wait for the previous one).

Before publishing, every file's size and checksum goes into ``manifest.json``
(``training.checkpoint.integrity``): each rank checksums what it wrote (in the background thread
for asynchronous saves), so that a resume can tell damaged bytes from a checkpoint this run
cannot use. The optimizer's state is saved by parameter name
(``training.checkpoint.optimizer_state``), so any world size can resume it.

A failed write (a full disk, a storage error) raises :class:`CheckpointWriteError` naming the
checkpoint and the newest intact one; its ``.tmp`` directory is removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint.integrity import checksum_own_files, write_manifest
from training.checkpoint.layout import (
    CONFIG_FILE,
    TRAINER_FILE,
    checkpoint_root,
    complete_checkpoints,
    rank_file,
    single_process_is_intended,
    step_dir_name,
)
from training.checkpoint.optimizer_state import state_to_save
from training.checkpoint.rng import rng_state
from training.errors import CheckpointWriteError
from training.runtime import distributed
from training.runtime.distributed import Env

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    step: int
    tmp: Path
    future: Future


class CheckpointWriter:
    """Saves checkpoints of one run: ``save`` at a step, ``poll`` every step, ``wait`` at exits.

    ``stall_s`` adds up the seconds training stood still for checkpoints (the whole write when
    synchronous; staging and the small files when asynchronous).
    """

    def __init__(self, run_dir: str | Path, env: Env, keep: int, asynchronous: bool) -> None:
        self.run_dir, self.env, self.keep, self.asynchronous = (
            Path(run_dir),
            env,
            keep,
            asynchronous,
        )
        self.in_flight: _InFlight | None = None
        self.stall_s = 0.0
        self.saves = 0
        self.group = None
        # waits for DCP's background write, then checksums this rank's files, off the loop
        self.background = ThreadPoolExecutor(1, "checkpoint-checksums") if asynchronous else None
        if asynchronous and dist.is_initialized():
            self.group = dist.new_group(backend="gloo")
        elif asynchronous:  # the background write warns outside single_process_is_intended()
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict,
        data_state: dict,
        config_yaml: str,
    ) -> Path:
        """Write (or start writing) checkpoint ``step``; returns its final path."""
        self.wait()
        started = time.perf_counter()
        root = checkpoint_root(self.run_dir)
        rank = self.env.rank
        tmp = root / f"{step_dir_name(step)}.tmp"
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # a leftover from a crashed save
            tmp.mkdir(parents=True)
        distributed.barrier()
        try:
            self._write_small_files(tmp, trainer_state, data_state, config_yaml)
        except OSError as error:
            failed = error
        else:
            failed = None
        if distributed.any_rank(failed is not None, self.env.device):  # all ranks stop alike
            self._failed(step, tmp, failed or RuntimeError("failed on another rank"))
        try:
            state = state_to_save(model, optimizer)
            with single_process_is_intended():
                if self.asynchronous:
                    written = dcp.async_save(
                        state, checkpoint_id=str(tmp), process_group=self.group
                    )
                    future = self.background.submit(_checksums_once_written, written, tmp, rank)
                else:
                    dcp.save(state, checkpoint_id=str(tmp))
                    own = checksum_own_files(tmp, rank)
        except BaseException as error:  # DCP's CheckpointException derives from BaseException
            if not isinstance(error, Exception | CheckpointException):
                raise
            self._failed(step, tmp, error)
        self.stall_s += time.perf_counter() - started
        self.saves += 1
        if self.asynchronous:
            self.in_flight = _InFlight(step, tmp, future)
        else:
            self._publish(step, tmp, own)
        return root / step_dir_name(step)

    def poll(self) -> None:
        """Publish the in-flight checkpoint once every rank has written its part."""
        if self.in_flight is None:
            return
        if distributed.any_rank(not self.in_flight.future.done(), self.env.device):
            return
        self.wait()

    def wait(self) -> None:
        """Block until the in-flight checkpoint (if any) is written, then publish it."""
        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return
        started = time.perf_counter()
        own: dict = {}
        try:
            own = flight.future.result()
        except BaseException as error:
            if not isinstance(error, Exception | CheckpointException):
                raise
            failed = error
        else:
            failed = None
        if distributed.any_rank(failed is not None, self.env.device):
            self._failed(flight.step, flight.tmp, failed or RuntimeError("failed on another rank"))
        self.stall_s += time.perf_counter() - started
        self._publish(flight.step, flight.tmp, own)

    def _write_small_files(self, tmp: Path, trainer_state, data_state, config_yaml) -> None:
        with open(rank_file(tmp, self.env.rank), "wb") as f:
            torch.save(
                {"data": data_state, "rng": rng_state(), "world_size": self.env.world_size}, f
            )
            flush_to_disk(f)
        if self.env.is_main:
            for name, text in (
                (TRAINER_FILE, json.dumps(trainer_state, indent=2) + "\n"),
                (CONFIG_FILE, config_yaml),
            ):
                with open(tmp / name, "w") as f:
                    f.write(text)
                    flush_to_disk(f)

    def _publish(self, step: int, tmp: Path, own: dict) -> None:
        """The manifest, then the rename that makes the checkpoint visible (``own``: this
        rank's files' checksums)."""
        try:
            write_manifest(tmp, own, self.env, flush_to_disk)
        except OSError as error:
            failed = error
        else:
            failed = None
        if distributed.any_rank(failed is not None, self.env.device):
            self._failed(step, tmp, failed or RuntimeError("failed on another rank"))
        self._rename(step, tmp)

    def _rename(self, step: int, tmp: Path) -> None:
        """The atomic step: from here on the checkpoint exists (and the oldest beyond
        ``keep`` goes)."""
        final = tmp.with_name(step_dir_name(step))
        if self.env.is_main:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            for old in complete_checkpoints(self.run_dir)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            log.info("saved %s", final)
        distributed.barrier()

    def _failed(self, step: int, tmp: Path, error: BaseException) -> None:
        cause = _root_cause(error)
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = complete_checkpoints(self.run_dir)
        kept = f"{previous[-1]} is intact" if previous else "there is no earlier checkpoint"
        raise CheckpointWriteError(
            f"could not write the checkpoint of step {step} to {tmp} "
            f"({type(cause).__name__}: {cause}); {kept}. Free space or fix the storage, then "
            "rerun the same command to resume."
        ) from error


def _checksums_once_written(written: Future, tmp: Path, rank: int) -> dict:
    written.result()
    return checksum_own_files(tmp, rank)


def flush_to_disk(f) -> None:
    """fsync before the rename publishes the checkpoint, so a node crash cannot leave a
    published checkpoint with truncated files (DCP syncs its own shards)."""
    f.flush()
    os.fsync(f.fileno())


def _root_cause(error: BaseException) -> BaseException:
    """The first underlying error: DCP wraps the writer's OSError in a CheckpointException."""
    failures = getattr(error, "failures", None)  # CheckpointException: rank -> error
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        return _root_cause(first[0] if isinstance(first, tuple) else first)
    if error.__cause__ is not None:
        return _root_cause(error.__cause__)
    return error


def remove_crashed_saves(run_dir: str | Path, env: Env) -> list[Path]:
    """Delete the ``step_N.tmp`` directories a crashed save left (rank 0; every rank waits).

    Called when a run starts, before anything is saved: no save is in flight then, and a
    ``.tmp`` is never a checkpoint (only a published ``step_N`` is). Left alone, one whose step
    is not saved again would hold a whole checkpoint's disk for ever.
    """
    root = Path(run_dir) / "checkpoints"
    removed = []
    if env.is_main and root.is_dir():
        for tmp in sorted(root.glob("step_*.tmp")):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
            log.warning("removed %s, left by a save that did not complete", tmp)
    distributed.barrier()
    return removed
