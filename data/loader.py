"""The training DataLoader (endless, exactly resumable), the pipeline's counters read back from
its state, and the held-out slice's loaders. The training loader's resume from a checkpoint:
``data.restore``; how a source cuts its held-out slice into windows: ``data.validation``."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing
import multiprocessing.util  # registers its exit hook now, before ours: ours runs first (LIFO)
import signal
import warnings
from collections import Counter
from collections.abc import Iterator

from torch.utils.data import DataLoader, IterableDataset

from data.config import DataConfig
from data.mixture import COUNTER_PREFIX
from data.source import DataError
from data.sources import get_source

# Always reported by ``counters``, so every rank all-reduces the same keys.
COUNTERS = (
    "documents",  # documents packed into training windows (text sources)
    "tokens",  # their tokens, BOS/EOS included (text sources); windows x seq_len (tokenized)
    "windows",  # training windows yielded (tokenized)
    "bad_records",  # not UTF-8 / JSON, no text field, text not a string or not encodable
    "empty_documents",  # empty or whitespace-only text
    "filtered_documents",  # below data.min_int_score
    "bad_files",  # unreadable files or row groups, or files that stop early
    "skipped",  # records without usable text (fineweb_edu)
)


# What the trainer's main process turns into a checkpoint (training/runtime/preemption.py). SLURM
# sends them to every process of the step; a worker that died of one (PyTorch's worker kills itself
# on a SIGTERM its parent did not send) would stop the main process mid-step, checkpoint lost.
WORKER_IGNORED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def ignore_stop_signals(worker_id: int) -> None:
    """Every DataLoader worker's start: leave the stop signals to the main process, which
    ends the workers itself once it has checkpointed."""
    for sig in WORKER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _kill_workers_left_at_exit() -> None:
    """Kill the DataLoader workers still alive when the interpreter exits.

    Why they can still be alive: a run that failed leaves through an exception, and the loader's
    iterator outlives the run (the traceback keeps ``Trainer.run``'s frame, and with it the
    iterator, until the interpreter ends). So PyTorch's own shutdown of the workers (set the
    done event, let them leave) never runs: by the time the iterator is collected, PyTorch's
    own exit hook has told it that Python is exiting, and it does nothing.

    Why they must be killed, not terminated: they ignore SIGTERM (``ignore_stop_signals``), so
    multiprocessing's exit hook, which sends its daemon children SIGTERM and then joins them
    with no timeout, would wait for ever (py-spy of a hung run: the main thread in
    ``multiprocessing.util._exit_function`` -> ``Process.join``, the worker idle in its loop).

    Why SIGCHLD goes back to its default first: PyTorch's SIGCHLD handler raises "DataLoader
    worker (pid N) is killed by signal: Killed" in the main thread when a worker of a live
    iterator dies, and the first worker killed here is exactly that. Raised while this hook was
    still joining, it ended the hook ("Exception ignored in atexit callback"), the next worker
    was never killed and multiprocessing's join hung on it: a race, lost by some ranks in some
    runs. One rank that lost it hung a 2-rank job whenever the other rank did not fail in turn
    (it waited for the hung rank in a collective, or had ended well and torchrun waited on):
    in tests/test_crash_exits.py, 10 runs a case, 5 hangs when one rank raised at a step and 3
    when rank 0 raised in its closing summary. Kill every worker before joining any, and let
    no error stop the loop, for the same reason.
    """
    with contextlib.suppress(ValueError):  # ValueError: not the main thread
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(Exception):
            child.kill()
    for child in children:
        with contextlib.suppress(Exception):
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


def first_batch(loader) -> tuple[Iterator[dict], DataError | None]:
    """``(batches, None)``: the loader's iterator with its first batch drawn and put back in
    front; ``(None, error)`` when the data cannot feed that batch (``data.source.DataError``).

    The trainer calls it before it writes anything, so that data which cannot feed a step is a
    refusal like a bad setting, not a traceback in a run directory already written. A worker's
    error reaches this process as "Caught DataError in DataLoader worker process 0. Original
    Traceback ...": its own message is taken back out of that.
    """
    batches = iter(loader)
    try:
        first = next(batches)
    except DataError as error:
        message = str(error)
        if "Original Traceback" in message:
            message = message.rsplit(f"{DataError.__name__}: ", 1)[-1].strip()
        return None, DataError(message)
    return itertools.chain([first], batches), None


def counters(loader_state: dict) -> dict[str, int]:
    """The pipeline's counters on this rank, from ``build_loader(...).state_dict()``.

    Sums the ``stats`` of every worker's stream (each worker's state as of the last batch it
    delivered; with ``num_workers=0`` the one stream's). Counters are cumulative over the run,
    resumes included, and count the training part only: records in the held-out validation slice
    are never counted. Every name in ``COUNTERS`` is present (0 when a source does not count
    it), so the dicts of all ranks have the same keys and can be all-reduced as they are; the
    sum over ranks counts each record once. A mixture adds each source's training tokens
    (``mixture/<name>``, every name in every started stream's state, so every rank has them).
    Any other counter is left out.
    """
    total = Counter(dict.fromkeys(COUNTERS, 0))
    for state in _dataset_states(loader_state):
        stats = (state.get("pending") or {}).get("stats") or {}
        total.update(
            {k: int(v) for k, v in stats.items() if k in total or k.startswith(COUNTER_PREFIX)}
        )
    shares = sorted(key for key in total if key not in COUNTERS)
    return {key: total[key] for key in (*COUNTERS, *shares)}


def _dataset_states(state):
    """Every ``dataset_state`` in a StatefulDataLoader state (one per worker, or the main one)."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == "dataset_state" and isinstance(value, dict):
                yield value
            else:
                yield from _dataset_states(value)


class ValidationStream(IterableDataset):
    """Every rank packs the whole slice the same way and keeps windows ``i % world_size ==
    rank`` (``data.partition``'s rule), so the windows, and the token-weighted loss over them,
    do not depend on the world size."""

    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size

    def __iter__(self):
        windows = get_source(self.config.source).validation(self.config)
        return itertools.islice(windows, self.rank, None, self.world_size)


def build_validation_loader(
    config: DataConfig, batch_size: int | None, rank: int = 0, world_size: int = 1
) -> DataLoader:
    """This rank's share of the held-out slice (a mixture's: every source's, one after the
    other)."""
    return DataLoader(ValidationStream(config, rank, world_size), batch_size=batch_size)


def build_validation_loaders(
    config: DataConfig, batch_size: int | None, rank: int = 0, world_size: int = 1
) -> dict[str, DataLoader]:
    """This rank's share of each source's held-out slice, by ``data.sources`` name, so that each
    source is also measured alone; ``{"": loader}`` for a single source."""
    parts = config.mixture_parts() or [("", config)]
    return {
        name: build_validation_loader(part, batch_size, rank, world_size) for name, part in parts
    }
