"""Signals that stop a run: each one gets a checkpoint at the next step boundary; what follows
depends on what the signal means under SLURM.

- **SIGUSR1** (``#SBATCH --signal=USR1@120``: the time limit is 2 minutes away) and **SIGUSR2**
  (what submitit sends before its time limit): checkpoint, ``scontrol requeue`` the job, exit
  ``EXIT_PREEMPTED``. The job comes back and resumes.
- **SIGTERM** (``scancel``; the scheduler preempting the job; the time limit reached without
  a warning signal): checkpoint, exit ``EXIT_PREEMPTED``, and *no* requeue. After ``scancel``
  a person wants the job gone; a preemption with ``PreemptMode=REQUEUE`` is requeued by SLURM
  itself. Resuming by hand is rerunning the same command.

The handler only sets a flag: the step in flight finishes, every rank agrees (a rank may get
the signal later than another, and the requeue wins if any rank got a requeue signal), the
trainer writes a checkpoint, and exits. DataLoader workers ignore these signals
(``data.loader``), so a signal sent to every process of the step (as slurmstepd does) reaches
the main process's flag instead of killing a worker mid-step.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess

from training.runtime import distributed

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later
STOP, REQUEUE = 1, 2  # what the ranks agree on (0: go on)
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = (signal.SIGTERM,)


class Preemption:
    def __init__(self) -> None:
        self.requested: int | None = None
        self.checkpointed = False  # stopped for a signal, and the checkpoint is on disk
        self._previous = {}

    def install(self) -> None:
        # USR2: what the submitit launcher asks for before a time limit; we checkpoint and
        # requeue ourselves instead of its pickling mechanism
        for sig in (*REQUEUE_SIGNALS, *STOP_SIGNALS):
            self._previous[sig] = signal.signal(sig, self._handle)

    @property
    def wants_requeue(self) -> bool:
        return self.requested in REQUEUE_SIGNALS

    def agreed_wish(self, env: distributed.Env) -> int:
        """0 (go on), ``STOP`` or ``REQUEUE``: the strongest wish over the ranks (a collective;
        a rank may get the signal later than another)."""
        own = REQUEUE if self.wants_requeue else STOP if self.requested is not None else 0
        wish = int(distributed.all_reduce_max([float(own)], env.device)[0])
        if wish and env.is_main:
            log.warning("signal %s received", self.requested or "on another rank")
        return wish

    def stopped(self, wish: int, step: int, is_main: bool) -> int:
        """The exit code once the stop's checkpoint is on disk; rank 0 requeues the job when
        a rank was asked to."""
        self.checkpointed = True
        if wish == REQUEUE and is_main:
            log.warning("stopping at step %d; requeueing the job", step)
            return requeue_or_exit_code()
        if is_main:
            log.warning(
                "stopping at step %d, its newest good checkpoint on disk, not requeued "
                "(SIGTERM: scancel or the scheduler, which requeues by itself if it "
                "preempted); rerun the same command to resume",
                step,
            )
        return EXIT_PREEMPTED

    def uninstall(self) -> None:
        """The previous handlers back; or, once a stop is checkpointed, the stop signals
        ignored until the process has exited with ``EXIT_PREEMPTED``. The ranks leave one after
        another, and torchrun (or slurmstepd, again) sends SIGTERM to those still shutting
        down: they died of it (-15) although their part was saved, and a job preempted cleanly
        looked killed. Ignored, not handled: Python puts back the default action of every
        signal it handles when the interpreter finalizes (the workers' shutdown takes a while
        then), but leaves an ignored one ignored."""
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.checkpointed else handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        # only set the flag: logging here could re-enter a stream the main thread is writing;
        # a requeue signal is not overridden by a SIGTERM that follows it
        if self.requested not in REQUEUE_SIGNALS:
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
