"""The faults the tests inject into training runs: a plugin (``training/plugins.py``), so that
none of it lives in the trainer's config, loop or writer.

A ``train.py`` subprocess gets them through its environment, which ``faults_env`` builds::

    XIELU_PLUGINS=tests/faults.py XIELU_FAULTS='{"signal": "SIGKILL@6"}' python train.py ...

and a run in the test's own process through ``fault_components(...)`` handed to
``training.loop.train``. The faults:

- ``nan_steps``: the loss is NaN at these steps (0-based: the step about to be taken), through a
  forward hook on the model, so the gradients are NaN too;
- ``crash_in_checkpoint_at``: the process dies (exit 13) inside that step's save: a synchronous
  save once every file and the manifest are written, before the rename that publishes it; an
  asynchronous one while its write is in flight;
- ``signal``: ``SIGNAL@STEP[@RANK]``: the process (of that rank) sends itself SIGNAL once step
  STEP's update is done, before the trainer checks for stop signals: an interruption at a
  known step, where a signal sent from outside would race the run;
- ``raise_in``: ``WHERE@STEP@RANKS``: a ``RuntimeError`` on those ranks (``0,1``) inside
  training step STEP once its gradients are complete (``step@2@1``), from the downstream
  evaluator (``downstream@@0,1``) or from the run's closing summary (``summary@@0``).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from training.components import Component

ENVIRONMENT_VARIABLE = "XIELU_FAULTS"
EXIT_CRASH_INJECTED = 13
PLUGIN = Path(__file__).resolve()


class NanLoss(Component):
    name = "fault_nan_loss"

    def __init__(self, steps: list[int]) -> None:
        self.steps, self.armed = set(steps), False

    def begin(self, trainer) -> None:
        trainer.model.bare.register_forward_hook(self._poison)

    def step_start(self, trainer, step: int) -> None:
        self.armed = step - 1 in self.steps  # only the training forwards of that step

    def before_clip(self, trainer, step: int) -> None:
        self.armed = False

    def _poison(self, module, inputs, loss):
        return loss * float("nan") if self.armed else loss


class CrashInCheckpoint(Component):
    name = "fault_crash_in_checkpoint"

    def __init__(self, step: int) -> None:
        self.step = step

    def begin(self, trainer) -> None:
        writer = trainer.checkpointing.writer
        if writer.asynchronous:
            save = writer.save

            def save_then_die(step, *args, **kwargs):
                path = save(step, *args, **kwargs)
                if step == self.step:
                    os._exit(EXIT_CRASH_INJECTED)  # the write in flight
                return path

            writer.save = save_then_die
        else:
            rename = writer._rename

            def die_before_rename(step, tmp):
                if step == self.step:
                    os._exit(EXIT_CRASH_INJECTED)  # every part written, nothing published
                rename(step, tmp)

            writer._rename = die_before_rename


class SignalAtStep(Component):
    name = "fault_signal"

    def __init__(self, spec: str) -> None:
        parts = spec.split("@")
        if len(parts) not in (2, 3) or not hasattr(signal.Signals, parts[0]):
            raise ValueError(f"signal={spec!r} is not SIGNAL@STEP or SIGNAL@STEP@RANK")
        self.signal, self.step = signal.Signals[parts[0]], int(parts[1])
        self.rank = int(parts[2]) if len(parts) == 3 else None

    def after_update(self, trainer, step: int, stepped: bool) -> None:
        if step == self.step and self.rank in (None, trainer.env.rank):
            os.kill(os.getpid(), self.signal)


class RaiseIn(Component):
    name = "fault_raise"

    def __init__(self, spec: str) -> None:
        parts = spec.split("@")
        if len(parts) != 3 or parts[0] not in ("step", "downstream", "summary"):
            shapes = "step@N@RANKS, downstream@@RANKS or summary@@RANKS"
            raise ValueError(f"raise_in={spec!r} is not {shapes}")
        self.where, self.ranks = parts[0], {int(rank) for rank in parts[2].split(",")}
        self.step = int(parts[1]) if parts[0] == "step" else None
        self.rank = None  # this process's, once the run has begun

    def fail(self, *args, **kwargs):
        raise RuntimeError(f"injected failure in the {self.where} on rank {self.rank}")

    def begin(self, trainer) -> None:
        self.rank = trainer.env.rank
        if self.rank not in self.ranks:
            return
        if self.where == "downstream":
            trainer.measure.evaluate_downstream = self.fail
        elif self.where == "summary":
            import training.summary

            training.summary.run_summary = self.fail  # closing_summary looks it up by name

    def before_clip(self, trainer, step: int) -> None:
        if step == self.step and self.rank in self.ranks:
            self.fail()


def fault_components(
    nan_steps: list[int] = (),
    crash_in_checkpoint_at: int | None = None,
    signal: str = "",
    raise_in: str = "",
) -> list[Component]:
    found: list[Component] = []
    if nan_steps:
        found.append(NanLoss(list(nan_steps)))
    if crash_in_checkpoint_at is not None:
        found.append(CrashInCheckpoint(crash_in_checkpoint_at))
    if signal:
        found.append(SignalAtStep(signal))
    if raise_in:
        found.append(RaiseIn(raise_in))
    return found


def faults_env(**faults) -> dict[str, str]:
    """The environment that makes a ``train.py`` subprocess inject ``faults``."""
    fault_components(**faults)  # a typo fails here, in the test, not in the subprocess
    return {"XIELU_PLUGINS": str(PLUGIN), ENVIRONMENT_VARIABLE: json.dumps(faults)}


def components(config) -> list[Component]:
    """The plugin's entry point (``training/plugins.py``)."""
    return fault_components(**json.loads(os.environ.get(ENVIRONMENT_VARIABLE, "{}")))
