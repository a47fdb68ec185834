"""Everything the trainer does besides the update is a component, run at named hook points.

Wired into the loop by hand, one part's state was once left out of the checkpoint, one
measurement out of the "missed at a stop signal" rule, and "every N steps" was written four
ways. So each part is a :class:`Component` that owns its cadence (``every``, ``at``, ``due``),
its settings and its state, and the trainer only runs the hook points in order.

**Every hook that concerns a step is handed that step, 1-based: the step being taken in
``step_start``, ``before_clip``, ``before_update`` and ``after_update``, the same step, just
taken, in ``step_end`` (0 there: the regime at initialisation); and a hook named in the
component's ``on_cadence`` runs only at the steps its ``due`` says, the others at every step.**

- ``begin``: once, before anything else this process runs (after a resume: at its step);
- ``step_start``: before the step's first micro-batch (the profiler opens its span);
- ``before_clip``: the step's gradients are complete and not yet clipped (per-layer norms);
- ``before_update``: the loss and global gradient norm are known; any component may cancel the
  update (the non-finite rule, the spike monitor), every one of them sees the step;
- ``after_update``: the update is applied or skipped; components add to the step's record;
- ``step_end``: on the component's cadence, once the step is over (logging, validation,
  diagnostics, downstream, profiling, checkpointing);
- ``end``: the run is leaving the loop, normally or not.

A stop signal goes straight to the checkpoint (the grace period is short), and ``at_stop``
says, per component, what happens to its end-of-step work at the interrupted step:
``AtStop.LATER`` keeps it pending (saved in the checkpoint) for the resumed run to do first, on
the same restored weights, logged at the same step; ``AtStop.NOW`` runs it at its step anyway;
``AtStop.ALWAYS`` runs it at every stop, due or not (the checkpoint is written at the stop).
The anchors are torchtitan's components and OLMo-core's callbacks; this is the smaller set of
hook points a Llama pretraining loop needs. docs/extending.md adds one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from training.errors import CheckpointFormatError, ConfigError


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class AtStop(enum.Enum):
    LATER = "later"  # due work at an interrupted step: pending, done first on resume
    NOW = "now"  # due work at an interrupted step: done at its step
    ALWAYS = "always"  # done at every stop, due or not


@dataclass(frozen=True)
class Context:
    """What a shipped component is built from (:meth:`Component.from_context`): the run's
    settings and the parts the trainer made for the run, nothing else of the trainer.

    Attributes:
        config: the run's ``training.config.ExperimentConfig``: a component reads its own
            section (``checkpoint``, ``validation``, ``spikes``, ``profile``, ``logging``).
        env: ``training.runtime.distributed.Env``: rank, world size, device.
        model: the ``training.runtime.parallelize.TrainingModel`` being trained.
        model_config: the built model's ``ModelConfig`` (its vocabulary from the tokenizer).
        run_dir: where the run writes.
        batches: ``training.batch_ramp.BatchPlan``: each step's global batch and position.
        measure: ``training.instruments.measurements.Measurements``: the held-out batches and
            the evaluators the measuring components share.
    """

    config: Any
    env: Any
    model: Any
    model_config: Any
    run_dir: Path
    batches: Any
    measure: Any


class Component:
    """A part of the trainer; override the hooks it needs (each receives the trainer, and the
    step it concerns: the module's rule).

    ``every``: the cadence in steps (0: none) of the hooks in ``on_cadence`` (``step_end``
    unless the component says otherwise); a cadenced component also runs at the run's last
    step. ``at``: steps it also runs at, whatever ``every``. ``at_last_even_when_off``: runs at
    the last step even with ``every=0``, for what a finished run must have (its last log line,
    checkpoint). Hooks run on every rank, in the order the components were given, so they may
    run collectives; a record is logged with ``trainer.log(record, step=step)`` (rank 0 writes
    it). A component that defines ``state_dict`` and ``load_state_dict`` (JSON values) is saved
    in every checkpoint under its ``name``.
    """

    name: str = ""
    every: int = 0
    at: tuple[int, ...] = ()
    on_cadence: tuple[str, ...] = ("step_end",)
    at_stop: AtStop = AtStop.LATER
    at_last_even_when_off = False  # the run's last step also with every=0 (log, checkpoint)

    @classmethod
    def from_context(cls, context: Context) -> Component | None:
        """A shipped component, built from its section of the settings and the run's parts
        (:class:`Context`), or None where it has nothing to do: the trainer lists its
        components without knowing their keys (``training.loop.SHIPPED``)."""
        raise NotImplementedError(f"{cls.__name__} is not built by the trainer")

    def due(self, step: int, last: int) -> bool:
        """Whether the hooks in ``on_cadence`` run at ``step`` (1-based) of ``last``."""
        if step in self.at:
            return True
        if self.every <= 0:
            return self.at_last_even_when_off and step == last
        return (step > 0 and step % self.every == 0) or step == last

    def begin(self, trainer: Any) -> None: ...

    def step_start(self, trainer: Any, step: int) -> None: ...

    def before_clip(self, trainer: Any, step: int) -> None: ...

    def before_update(self, trainer: Any, step: int, loss: float, grad_norm: float) -> bool:
        return True

    def after_update(self, trainer: Any, step: int, stepped: bool) -> None: ...

    def step_end(self, trainer: Any, step: int) -> None: ...

    def out_of_memory(self, trainer: Any) -> None: ...

    def end(self, trainer: Any, error: BaseException | None) -> None: ...


def _overrides(component: Component, hook: str) -> bool:
    return getattr(type(component), hook) is not getattr(Component, hook)


def keeps_state(component: object) -> bool:
    return hasattr(component, "state_dict") and hasattr(component, "load_state_dict")


class TrainerState:
    """Named stateful parts; their states travel in the checkpoint's ``trainer.json``, so each
    ``state_dict`` holds JSON values (numbers, strings, lists, dicts)."""

    def __init__(self) -> None:
        self.parts: dict[str, Stateful] = {}
        self.optional: set[str] = set()  # may be missing from a checkpoint: starts afresh

    def register(self, name: str, part: Stateful, required: bool = True) -> None:
        """``required=False`` for a part a resumed run may have gained (a component added to a
        run that has checkpoints): it starts from its initial state instead of the run being
        refused."""
        if name in self.parts:
            raise ValueError(f"a trainer part named {name!r} is registered already")
        self.parts[name] = part
        if not required:
            self.optional.add(name)

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [name for name in self.parts if name not in state and name not in self.optional]
        if missing:
            raise CheckpointFormatError(
                f"the checkpoint has no state for {', '.join(missing)} (written by another "
                "version of this trainer): resume it with that version, or start a new run_dir"
            )
        for name, part in self.parts.items():
            if name in state:
                part.load_state_dict(state[name])


def _repeated(components: list[Component]) -> str:
    """Each name held by more than one component, with whose they are (module and class): a
    plugin's component named like a shipped one (docs/extending.md) names the plugin."""
    owners: dict[str, list[str]] = {}
    for c in components:
        owners.setdefault(c.name, []).append(f"{type(c).__module__}.{type(c).__qualname__}")
    return "; ".join(
        f"{name!r} by {' and '.join(classes)}"
        for name, classes in owners.items()
        if len(classes) > 1
    )


class Components:
    """The trainer's components in order, the hook points that run them, and the end-of-step
    work a stop signal left pending (its state: ``{"pending": [names]}``)."""

    def __init__(self, components: Iterable[Component], last: int) -> None:
        self.all = list(components)
        self.last = last
        self.by_name = {c.name: c for c in self.all}
        if len(self.by_name) != len(self.all):
            raise ConfigError(f"component names repeat: {_repeated(self.all)}")
        self.cadenced = [c for c in self.all if _overrides(c, "step_end")]
        self.pending: list[str] = []

    def begin(self, trainer: Any) -> None:
        for c in self.all:
            c.begin(trainer)

    def _run(self, hook: str, trainer: Any, step: int, *args: Any) -> list[Any]:
        """``hook`` of every component, each at its cadence (the module's rule)."""
        return [
            getattr(c, hook)(trainer, step, *args)
            for c in self.all
            if hook not in c.on_cadence or c.due(step, self.last)
        ]

    def step_start(self, trainer: Any, step: int) -> None:
        self._run("step_start", trainer, step)

    def before_clip(self, trainer: Any, step: int) -> None:
        self._run("before_clip", trainer, step)

    def before_update(self, trainer: Any, step: int, loss: float, grad_norm: float) -> bool:
        return all(self._run("before_update", trainer, step, loss, grad_norm))

    def after_update(self, trainer: Any, step: int, stepped: bool) -> None:
        self._run("after_update", trainer, step, stepped)

    def step_end(self, trainer: Any, step: int, stopping: bool) -> None:
        """The end-of-step work due at ``step``; at a stop, each component's ``at_stop`` rule."""
        for c in self.cadenced:
            due = "step_end" not in c.on_cadence or c.due(step, self.last)
            if stopping and c.at_stop is AtStop.LATER:
                if due:
                    self.pending.append(c.name)
            elif due or (stopping and c.at_stop is AtStop.ALWAYS):
                c.step_end(trainer, step)

    def run_pending(self, trainer: Any, step: int) -> None:
        """The interrupted step's work, first thing on resume, unless this run's config no
        longer has it due at that step."""
        pending, self.pending = self.pending, []
        for name in pending:
            if self.by_name[name].due(step, self.last):
                self.by_name[name].step_end(trainer, step)

    def out_of_memory(self, trainer: Any) -> None:
        for c in self.all:
            c.out_of_memory(trainer)

    def end(self, trainer: Any, error: BaseException | None) -> None:
        for c in self.all:
            c.end(trainer, error)

    def state_dict(self) -> dict[str, Any]:
        return {"pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = [name for name in state["pending"] if name not in self.by_name]
        if unknown:
            raise CheckpointFormatError(f"pending work {unknown} is not a component here")
        self.pending = list(state["pending"])
