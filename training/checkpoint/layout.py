"""What a checkpoint is on disk, and how the published ones of a run are found.

``<run_dir>/checkpoints/step_000120/`` holds the model and optimizer (``torch.distributed.
checkpoint``'s ``.metadata`` and ``.distcp`` shards), one ``rank_00000.pt`` per rank (its data
state and RNG, and how many ranks wrote the checkpoint), ``trainer.json`` (step, tokens,
counters) and ``config.yaml`` (the resolved config of the run that wrote it). It is written as
``step_000120.tmp`` and renamed when complete, so a directory named ``step_N`` is always whole;
one that turned out not to load is renamed ``step_N.corrupt``. Both the writer and the readers
call DCP on it from a single process when there is one (:func:`single_process_is_intended`).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from settings import Run, Section, at_least

STEP_DIR = re.compile(r"^step_(\d{6,})$")
TRAINER_FILE = "trainer.json"
CONFIG_FILE = "config.yaml"
RANK_FILES = "rank_*.pt"


@dataclass
class CheckpointConfig(Section):
    """``checkpoint``: when the run saves and how many saves it keeps
    (``training.checkpoint.saving.Checkpointing``, ``training.checkpoint.writer``).

    Attributes:
        every: steps between checkpoints (and one at the end, and at every stop); 0: only at
            the end.
        async_write: write checkpoints in the background while training goes on (the weights
            are first copied to CPU memory); published, as synchronous ones, only once complete.
        keep: how many recent checkpoints to keep.
        initial_hf: a transformers checkpoint directory (this project's export, a Llama, an
            Apertus) whose weights a fresh run starts from, with a fresh optimizer; its
            architecture is the model's (``training/initial_weights.py``: what is read from
            it, what is refused). A run with a checkpoint of its own resumes from that.
    """

    every: int = 50
    async_write: bool = False
    keep: int = 2
    initial_hf: str | None = None

    def check(self, run: Run | None = None) -> None:
        at_least("checkpoint.every", self.every, 0)
        at_least("checkpoint.keep", self.keep, 1)


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def step_of(checkpoint: Path) -> int:
    """The training step a published checkpoint directory holds."""
    return int(STEP_DIR.match(checkpoint.name).group(1))


def rank_file(checkpoint: Path, rank: int) -> Path:
    return checkpoint / f"rank_{rank:05d}.pt"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Published checkpoints, oldest first (``.tmp`` directories are never complete)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=step_of)


@contextlib.contextmanager
def single_process_is_intended():
    """DCP warns when no process group exists; single-process runs are meant to have none."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
