"""The training DataLoader (endless, exactly resumable) and the pipeline's counters read back
from its state. Its resume from a checkpoint: ``data.restore``; the held-out slice's loader:
``data.validation``."""

from __future__ import annotations

import atexit
import multiprocessing
import signal
import warnings
from collections import Counter

from data.config import DataConfig
from data.registry import get_source

# Always reported by ``counters``, so every rank all-reduces the same keys.
COUNTERS = (
    "documents",  # documents packed into training windows (text sources)
    "tokens",  # their tokens, BOS/EOS included (text sources); windows x seq_len (tokenized)
    "windows",  # training windows yielded (tokenized)
    "bad_records",  # not UTF-8 / JSON, no text field, or text not a string
    "empty_documents",  # empty or whitespace-only text
    "filtered_documents",  # below data.min_int_score
    "bad_files",  # unreadable files or row groups, or files that stop early
    "skipped",  # records without usable text (fineweb_edu)
)


# What the trainer's main process turns into a checkpoint (training/preemption.py). SLURM sends
# them to every process of the step; a worker that died of one (PyTorch's worker kills itself
# on a SIGTERM its parent did not send) would stop the main process mid-step, checkpoint lost.
WORKER_IGNORED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def ignore_stop_signals(worker_id: int) -> None:
    """Every DataLoader worker's start: leave the stop signals to the main process, which
    ends the workers itself once it has checkpointed."""
    for sig in WORKER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _kill_workers_left_at_exit() -> None:
    """Workers ignore SIGTERM, so multiprocessing's own exit hook, which sends SIGTERM to its
    children and then joins them, would wait for ever on a worker the loader did not shut
    down (the main process leaving through an error, e.g. a peer rank that died): kill them
    first. Registered after multiprocessing's hook, so it runs before it."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=10)


_exit_hook_registered = False


def build_loader(config: DataConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """A ``StatefulDataLoader``: ``state_dict()`` / ``load_state_dict()`` resume exactly.

    Each worker is its own stream (see ``data.partition``); the loader's state holds every
    worker's position and which worker's batch comes next.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    global _exit_hook_registered
    if config.num_workers and not _exit_hook_registered:
        atexit.register(_kill_workers_left_at_exit)
        _exit_hook_registered = True

    # torchdata calls a torch API that torch has deprecated; nothing for a user to act on
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

    return StatefulDataLoader(
        get_source(config.source).training(config, rank, world_size),
        batch_size=batch_size,
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
        worker_init_fn=ignore_stop_signals,
        snapshot_every_n_steps=1,
    )


def counters(loader_state: dict) -> dict[str, int]:
    """The pipeline's counters on this rank, from ``build_loader(...).state_dict()``.

    Sums the ``stats`` of every worker's stream (each worker's state as of the last batch it
    delivered; with ``num_workers=0`` the one stream's). Counters are cumulative over the run,
    resumes included, and count the training part only: records in the held-out validation slice
    are never counted. Every name in ``COUNTERS`` is present (0 when a source does not count
    it), so the dicts of all ranks have the same keys and can be all-reduced as they are; the
    sum over ranks counts each record once. A counter that is not in ``COUNTERS`` is left out.
    """
    total = Counter(dict.fromkeys(COUNTERS, 0))
    for state in _dataset_states(loader_state):
        stats = (state.get("pending") or {}).get("stats") or {}
        total.update({k: int(v) for k, v in stats.items() if k in total})
    return dict(total)


def _dataset_states(state):
    """Every ``dataset_state`` in a StatefulDataLoader state (one per worker, or the main one)."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == "dataset_state" and isinstance(value, dict):
                yield value
            else:
                yield from _dataset_states(value)
