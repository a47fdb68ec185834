"""The trainer's stateful parts and its periodic work, each registered once.

A checkpoint must hold every part of the trainer whose state changes the run's future (the step
verdicts' counters and spike window, the work a stop signal interrupted), and a stop signal must
never lose a measurement. Wired into the loop by hand, one instrument's state was left out of the
checkpoint and one instrument out of the "missed at a signal" rule. Here a part is registered
by name in :class:`TrainerState`, which saves and restores all of them, and a measurement is a
:class:`Periodic` in :class:`PeriodicWork`, which runs what is due at a step or, when the step
was interrupted, keeps it pending (saved with the rest) for the resumed run to do first. The
anchor is torchtitan's components (checkpointer, validator, metrics), each owning its cadence
and state. A researcher's own measurement is an :class:`Instrument` handed to the trainer
(``training.loop.train(..., instruments=[...])``; docs/extending.md): the trainer makes it a
``Periodic`` and, when it keeps state, registers it, so it cannot miss either rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Instrument(Protocol):
    """A measurement added to the loop from outside training/ (docs/extending.md).

    ``name`` names it in the checkpoint and in the pending list; ``every`` is its cadence in
    steps (also taken at the last step; 0: never); ``measure(trainer)`` is called on every rank
    (it may run collectives) and returns the record rank 0 logs (other ranks' returns are
    ignored). An instrument with ``state_dict`` / ``load_state_dict`` is saved and restored
    with the trainer's other parts; its state must be JSON values.
    """

    name: str
    every: int

    def measure(self, trainer: Any) -> dict[str, float]: ...


class CheckpointFormatError(RuntimeError):
    """A checkpoint without a part this trainer registers: written by another version."""


class TrainerState:
    """Named stateful parts; their states travel in the checkpoint's ``trainer.json``, so each
    ``state_dict`` holds JSON values (numbers, strings, lists, dicts)."""

    def __init__(self) -> None:
        self.parts: dict[str, Stateful] = {}
        self.optional: set[str] = set()  # may be missing from a checkpoint: starts afresh

    def register(self, name: str, part: Stateful, required: bool = True) -> None:
        """``required=False`` for a part a resumed run may have gained (an instrument added
        to a run that has checkpoints): it starts from its initial state instead of the run
        being refused."""
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


@dataclass(frozen=True)
class Periodic:
    """A measurement the loop takes every ``every`` steps (0: never) and also at the steps in
    ``at`` (e.g. the end of the stable phase and of the run). ``run`` is called on every rank
    (measurements are collectives) and logs what it measured itself."""

    name: str
    every: int
    run: Callable[[], None]
    at: tuple[int, ...] = ()

    def due(self, step: int) -> bool:
        if self.every <= 0:
            return False
        return (step > 0 and step % self.every == 0) or step in self.at


class PeriodicWork:
    """The measurements, in the order they run at a step, and those a stop signal left pending.

    A stop signal goes straight to the checkpoint (the grace period is short), so the work due
    at that step is not done then but saved as pending; the resumed run does it first, on the
    same restored weights, and logs it at the same step: every measurement is logged at each of
    its steps exactly once, interrupted or not.
    """

    def __init__(self, work: Iterable[Periodic]) -> None:
        self.work = {w.name: w for w in work}
        self.pending: list[str] = []

    def due(self, step: int) -> list[str]:
        return [name for name, w in self.work.items() if w.due(step)]

    def at_step(self, step: int, interrupted: bool) -> None:
        """Run what is due at ``step``, or, when the step was interrupted, keep it pending."""
        if interrupted:
            self.pending = self.due(step)
            return
        for name in self.due(step):
            self.work[name].run()

    def run_pending(self) -> None:
        """The interrupted step's work, unless the resumed run's config turned it off."""
        pending, self.pending = self.pending, []
        for name in pending:
            if self.work[name].every > 0:
                self.work[name].run()

    def state_dict(self) -> dict[str, Any]:
        return {"pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = [name for name in state["pending"] if name not in self.work]
        if unknown:
            raise CheckpointFormatError(f"pending work {unknown} is not a measurement here")
        self.pending = list(state["pending"])
