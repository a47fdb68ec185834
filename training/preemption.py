"""SLURM preemption: a signal asks for a checkpoint at the next step boundary, then a requeue.

``#SBATCH --signal=USR1@120`` makes SLURM send SIGUSR1 two minutes before the time limit;
SIGTERM arrives on preemption or ``scancel``. The handler only sets a flag: the step in
flight finishes, every rank agrees (a rank may get the signal later than another), the
trainer writes a checkpoint, and then the job requeues itself under SLURM or exits with
``EXIT_PREEMPTED`` so a wrapper script can tell "stopped to be resumed" from success or failure.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later


class Preemption:
    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous = {}

    def install(self) -> None:
        # USR2: what the submitit launcher asks for before a time limit; we checkpoint and
        # requeue ourselves instead of its pickling mechanism
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        # only set the flag: logging here could re-enter a stream the main thread is writing
        self.requested = signum


def requeue_or_exit_code() -> int:
    """Requeue the SLURM job if there is one (rank 0 calls this); the process exit code."""
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        try:
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
            log.warning("requeued SLURM job %s", job)
        except (OSError, subprocess.SubprocessError) as error:
            log.error("could not requeue SLURM job %s: %s", job, error)
    return EXIT_PREEMPTED


def parse_debug_signal(spec: str) -> tuple[signal.Signals, int, int | None] | None:
    """``trainer.debug_signal`` as (signal, step, rank or None for every rank); None when empty.

    ``"SIGKILL@6"``: every rank sends itself SIGKILL once step 6 is logged; ``"SIGKILL@5@1"``:
    rank 1 alone. Tests use it to interrupt a run at a known step instead of racing it from
    outside; the signal is real, so what follows it is what a scheduler's signal causes.
    """
    if not spec:
        return None
    name, _, rest = spec.partition("@")
    step, _, rank = rest.partition("@")
    try:
        sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        return sig, int(step), int(rank) if rank else None
    except (KeyError, ValueError):
        raise ValueError(
            f"trainer.debug_signal={spec!r} is not SIGNAL@STEP or SIGNAL@STEP@RANK (e.g. SIGKILL@6)"
        ) from None
