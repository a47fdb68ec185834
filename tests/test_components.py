"""The trainer's state registry and its periodic work (training/components.py)."""

from __future__ import annotations

import json

import pytest

from training.components import CheckpointFormatError, Periodic, PeriodicWork, TrainerState


class Log:
    def __init__(self) -> None:
        self.step = 0
        self.lines: list[tuple[int, str]] = []

    def measure(self, name: str):
        return lambda: self.lines.append((self.step, name))


def work(log: Log, steps: int) -> PeriodicWork:
    return PeriodicWork(
        [
            Periodic("diagnostics", 4, log.measure("diagnostics"), (0, steps)),
            Periodic("validation", 4, log.measure("validation"), (5, steps)),
            Periodic("downstream", 3, log.measure("downstream"), (steps,)),
        ]
    )


def train(log: Log, periodic: PeriodicWork, start: int, stop: int, signal_at: int | None):
    """The loop's use of it: pending work first, step 0's, then each step's; returns the
    step it stopped at and the state it would checkpoint."""
    log.step = start
    periodic.run_pending()
    if start == 0:
        periodic.at_step(0, interrupted=False)
    for step in range(start + 1, stop + 1):
        log.step = step
        interrupted = step == signal_at
        periodic.at_step(step, interrupted)
        if interrupted:
            return step, json.loads(json.dumps(periodic.state_dict()))
    return stop, None


@pytest.mark.parametrize("signal_at", [3, 4, 5, 6, 9, 12])
def test_a_stop_signal_never_loses_a_measurement_nor_repeats_one(signal_at):
    """Issue 29 defect 6: a stop at a downstream step lost that point, and at the last step
    the run's final downstream numbers; every step's work now runs exactly once."""
    steps = 12
    whole = Log()
    train(whole, work(whole, steps), 0, steps, None)
    assert (12, "downstream") in whole.lines and (5, "validation") in whole.lines

    log = Log()
    stopped, state = train(log, work(log, steps), 0, steps, signal_at)
    assert stopped == signal_at
    resumed = work(log, steps)
    resumed.load_state_dict(state)
    train(log, resumed, stopped, steps, None)
    assert log.lines == whole.lines


def test_pending_work_that_the_resumed_config_turned_off_is_dropped():
    log = Log()
    periodic = PeriodicWork([Periodic("downstream", 0, log.measure("downstream"), (8,))])
    periodic.load_state_dict({"pending": ["downstream"]})
    periodic.run_pending()
    assert log.lines == [] and periodic.pending == []


def test_the_registry_saves_every_part_and_refuses_a_checkpoint_without_one():
    log = Log()
    state = TrainerState()
    periodic = work(log, 12)
    periodic.pending = ["validation"]
    state.register("work", periodic)
    with pytest.raises(ValueError, match="registered already"):
        state.register("work", periodic)
    saved = state.state_dict()
    assert saved == {"work": {"pending": ["validation"]}}
    periodic.pending = []
    state.load_state_dict(saved)
    assert periodic.pending == ["validation"]
    with pytest.raises(CheckpointFormatError, match="no state for work"):
        state.load_state_dict({})
    added = Log()  # an instrument added to a run that has checkpoints starts afresh
    added.state_dict, added.load_state_dict = (lambda: {"n": 1}), added.lines.append
    state.register("added", added, required=False)
    state.load_state_dict(saved)
    assert added.lines == [] and state.state_dict()["added"] == {"n": 1}
    with pytest.raises(CheckpointFormatError, match="not a measurement"):
        periodic.load_state_dict({"pending": ["unknown"]})
