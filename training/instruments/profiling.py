"""Profiles of chosen steps: a torch.profiler trace per rank, and on CUDA a memory snapshot.

``profile.steps=[10,12]`` profiles steps 10 to 12 (as logged: step N is the N-th
update) and writes ``<run_dir>/profile/trace_rank00000_steps10-12.json``, a Chrome trace for
https://ui.perfetto.dev or ``chrome://tracing`` (TensorBoard's profiler plugin reads it too).
On CUDA, the allocator's history is recorded over the same steps and dumped to
``memory_rank00000_steps10-12.pickle`` at their end, or to ``memory_rank00000_oom.pickle`` if
they run out of memory, for https://pytorch.org/memory_viz. A CPU run never touches CUDA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from settings import ConfigError, Run, Section
from training.components import AtStop, Component, Context

log = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, steps: list[int], run_dir: str | Path, rank: int, device: torch.device):
        self.first, self.last = (steps[0], steps[1]) if steps else (0, -1)
        self.out = Path(run_dir) / "profile"
        self.rank, self.cuda = rank, device.type == "cuda"
        self.profiler = None
        self.label = None

    @property
    def name(self) -> str:
        return f"rank{self.rank:05d}_steps{self.first}-{self.last}"

    def before(self, step: int) -> None:
        """Called before update number ``step`` (1-based) is taken."""
        if step == self.first:
            self._start()
        if self.profiler is not None:  # each step a named span in the trace
            self.label = torch.profiler.record_function(f"train step {step}")
            self.label.__enter__()

    def _start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        self.profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True
        )
        self.profiler.__enter__()

    def after(self, step: int) -> None:
        """Called once update number ``step`` is done."""
        if self.profiler is None:
            return
        self.label.__exit__(None, None, None)
        if step == self.last:
            self._finish(self.name)

    def out_of_memory(self) -> None:
        """Dump what the allocator recorded (the trainer calls it on an OOM while profiling)."""
        if self.profiler is not None:
            self.label.__exit__(None, None, None)
            self._finish(f"rank{self.rank:05d}_oom")

    def _finish(self, name: str) -> None:
        self.profiler.__exit__(None, None, None)
        self.out.mkdir(parents=True, exist_ok=True)
        trace = self.out / f"trace_{name}.json"
        self.profiler.export_chrome_trace(str(trace))
        self.profiler = None
        written = [trace]
        if self.cuda:
            snapshot = self.out / f"memory_{name}.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            written.append(snapshot)
        log.info("profile written: %s", ", ".join(str(p) for p in written))


@dataclass
class ProfileConfig(Section):
    """``profile``: ``steps``, ``[first, last]``: profile those steps (as logged, from 1) into
    ``<run_dir>/profile/`` (a Chrome trace per rank; on CUDA a memory snapshot too); empty: no
    profiling."""

    steps: list[int] = field(default_factory=list)

    def check(self, run: Run | None = None) -> None:
        p, last = self.steps, run.config.trainer.steps if run else float("inf")
        if p and not (len(p) == 2 and 1 <= p[0] <= p[1] <= last):
            bound = f"trainer.steps={last}" if run else "the run's last step"
            raise ConfigError(
                f"profile.steps={list(p)} must be [first, last] with 1 <= first <= last <= {bound}"
            )


class Profiling(Component):
    """The profiler as the trainer's component: its cadence is its window of steps."""

    name = "profiling"
    at_stop = AtStop.NOW  # each profiled step's span closes at that step

    on_cadence = ("step_start", "step_end")

    def __init__(self, steps: list[int], run_dir: str | Path, rank: int, device) -> None:
        self.profiler = StepProfiler(steps, run_dir, rank, device)
        self.at = tuple(range(steps[0], steps[1] + 1)) if steps else ()  # every=0: only these

    @classmethod
    def from_context(cls, context: Context) -> Profiling:
        env = context.env
        return cls(context.config.profile.steps, context.run_dir, env.rank, env.device)

    def step_start(self, trainer: Any, step: int) -> None:
        self.profiler.before(step)

    def step_end(self, trainer: Any, step: int) -> None:
        self.profiler.after(step)

    def out_of_memory(self, trainer: Any) -> None:
        self.profiler.out_of_memory()
