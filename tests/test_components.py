"""The trainer's components, their hook points and stop rules, and the state registry
(training/components.py), driven the way training/loop.py drives them."""

from __future__ import annotations

import json

import pytest

from training.components import AtStop, Component, Components, TrainerState, keeps_state
from training.errors import CheckpointFormatError


class Trainer:
    def __init__(self) -> None:
        self.step = 0
        self.lines: list[tuple[int, str]] = []


class Measure(Component):
    def __init__(self, name: str, every: int, at=(), at_stop=AtStop.LATER) -> None:
        self.name, self.every, self.at, self.at_stop = name, every, tuple(at), at_stop

    def step_end(self, trainer, step: int) -> None:
        trainer.lines.append((step, self.name))


def components(steps: int) -> Components:
    return Components(
        [
            Measure("log", 2, at_stop=AtStop.NOW),
            Measure("diagnostics", 4, (0,)),
            Measure("validation", 4, (5,)),
            Measure("downstream", 3),
            Measure("checkpoint", 4, at_stop=AtStop.ALWAYS),
        ],
        last=steps,
    )


def train(trainer: Trainer, hooks: Components, stop: int, signal_at: int | None):
    """training/loop.py's use of them: pending work first, step 0's, then each step's; returns
    the step it stopped at and the state it would checkpoint."""
    hooks.run_pending(trainer, trainer.step)
    if trainer.step == 0:
        hooks.step_end(trainer, 0, stopping=False)
    while trainer.step < stop:
        trainer.step += 1
        stopping = trainer.step == signal_at
        hooks.step_end(trainer, trainer.step, stopping)
        if stopping:
            return json.loads(json.dumps(hooks.state_dict()))
    return None


@pytest.mark.parametrize("signal_at", [3, 4, 5, 6, 9, 12])
def test_a_stop_signal_never_loses_a_measurement_nor_repeats_one(signal_at):
    """A stop at a downstream step lost that point, and at the last step
    the run's final downstream numbers; every step's work now runs exactly once, a measurement
    at the interrupted step first thing on resume."""
    steps = 12
    whole = Trainer()
    train(whole, components(steps), steps, None)
    assert (12, "downstream") in whole.lines and (5, "validation") in whole.lines
    assert (0, "diagnostics") in whole.lines and (12, "checkpoint") in whole.lines

    stopped = Trainer()
    state = train(stopped, components(steps), steps, signal_at)
    checkpoints = [s for s, name in stopped.lines if name == "checkpoint"]
    assert checkpoints[-1] == signal_at  # written at the stop, due or not
    resumed = components(steps)
    resumed.load_state_dict(state)
    train(stopped, resumed, steps, None)
    without_stop_checkpoint = [
        line for line in stopped.lines if line != (signal_at, "checkpoint") or signal_at % 4 == 0
    ]
    assert sorted(without_stop_checkpoint) == sorted(whole.lines)
    # logging ran at the stopped step itself, the measurements after the resume
    first_after_stop = stopped.lines[stopped.lines.index((signal_at, "checkpoint")) + 1 :]
    due = {n for s, n in whole.lines if s == signal_at} - {"log", "checkpoint"}
    assert {n for s, n in first_after_stop[: len(due)]} == due


def test_pending_work_that_the_resumed_config_turned_off_is_dropped():
    trainer = Trainer()
    trainer.step = 8
    hooks = Components([Measure("downstream", 0)], last=12)
    hooks.load_state_dict({"pending": ["downstream"]})
    hooks.run_pending(trainer, 8)
    assert trainer.lines == [] and hooks.pending == []


def test_every_component_judges_a_step_and_any_one_cancels_its_update():
    class Verdict(Component):
        def __init__(self, name: str, allow: bool) -> None:
            self.name, self.allow, self.seen = name, allow, []

        def before_update(self, trainer, step, loss, grad_norm) -> bool:
            self.seen.append((trainer, step, loss, grad_norm))
            return self.allow

    trainer, no, yes = Trainer(), Verdict("no", False), Verdict("yes", True)
    assert Components([no, yes], last=1).before_update(trainer, 1, 2.0, 1.0) is False
    assert no.seen == yes.seen == [(trainer, 1, 2.0, 1.0)]  # the later one still saw the step
    assert Components([yes], last=1).before_update(trainer, 1, 2.0, 1.0) is True


def test_the_runs_end_reaches_every_component_with_the_error_it_ends_on():
    class End(Component):
        def __init__(self, name: str) -> None:
            self.name, self.seen = name, []

        def end(self, trainer, error) -> None:
            self.seen.append((trainer, error))

    trainer, error, parts = Trainer(), RuntimeError("out of disk"), [End("a"), End("b")]
    Components(parts, last=4).end(trainer, error)
    assert [p.seen for p in parts] == [[(trainer, error)]] * 2


def test_a_cadence_includes_the_last_step_and_its_extra_steps_and_never_zero_unless_asked():
    m = Measure("m", 5, at=(3,))
    assert [s for s in range(13) if m.due(s, 12)] == [3, 5, 10, 12]
    off = Measure("off", 0, at=(3,))  # no cadence: only the steps it names
    assert [s for s in range(13) if off.due(s, 12)] == [3]
    assert Measure("start", 5, at=(0,)).due(0, 12)
    last_only = Measure("log", 0)
    last_only.at_last_even_when_off = True  # the step log and checkpoint with a cadence of 0
    assert [s for s in range(13) if last_only.due(s, 12)] == [12]
    assert [s for s in range(4) if Measure("each", 1).due(s, 12)] == [1, 2, 3]  # not step 0


def test_the_hooks_run_a_cadenced_component_at_the_runs_last_step_too():
    trainer = Trainer()
    hooks = Components([Measure("validation", 4)], last=6)
    for step in range(1, 7):
        trainer.step = step
        hooks.step_end(trainer, step, stopping=False)
    assert trainer.lines == [(4, "validation"), (6, "validation")]
    # stopped at the last step, that step's validation runs first on resume
    stopped = Components([Measure("validation", 4)], last=6)
    stopped.step_end(trainer, 6, stopping=True)
    resumed = Components([Measure("validation", 4)], last=6)
    resumed.load_state_dict(json.loads(json.dumps(stopped.state_dict())))
    trainer.lines = []
    resumed.run_pending(trainer, 6)
    assert trainer.lines == [(6, "validation")]


def test_every_hook_named_on_cadence_runs_at_its_due_steps_handed_the_step_it_concerns():
    """The one rule of training/components.py: a hook in ``on_cadence`` runs when ``due``
    says, any other hook at every step, and each is handed the step (1-based)."""

    class Probe(Component):
        name, every, on_cadence = "probe", 2, ("before_clip", "after_update")

        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def step_start(self, trainer, step: int) -> None:
            self.calls.append(("step_start", step))

        def before_clip(self, trainer, step: int) -> None:
            self.calls.append(("before_clip", step))

        def before_update(self, trainer, step: int, loss: float, grad_norm: float) -> bool:
            self.calls.append(("before_update", step))
            return True

        def after_update(self, trainer, step: int, stepped: bool) -> None:
            self.calls.append(("after_update", step))

    probe, trainer = Probe(), Trainer()
    hooks = Components([probe], last=5)
    for step in range(1, 6):
        hooks.step_start(trainer, step)
        hooks.before_clip(trainer, step)
        hooks.before_update(trainer, step, 1.0, 1.0)
        hooks.after_update(trainer, step, True)
    every_step = [(hook, s) for s in range(1, 6) for hook in ("step_start", "before_update")]
    due = [(hook, s) for s in (2, 4, 5) for hook in ("before_clip", "after_update")]
    assert sorted(probe.calls) == sorted(every_step + due)


def test_measurements_switched_off_keep_no_extra_step():
    """``every=0`` turns validation and diagnostics off entirely: their extra steps (the end of
    the stable phase, step 0) are only theirs while they run."""
    from training.instruments.measurements import Diagnostics, Validation

    assert Validation(None, 0, stable_end=8).due(8, 10) is False
    assert Validation(None, 4, stable_end=6).due(6, 10) is True
    assert Diagnostics(None, 0).due(0, 10) is False
    assert Diagnostics(None, 5).due(0, 10) is True


def test_running_out_of_memory_reaches_every_component_with_the_trainer():
    class Dump(Component):
        def __init__(self, name: str) -> None:
            self.name, self.seen = name, []

        def out_of_memory(self, trainer) -> None:
            self.seen.append(trainer)

    trainer, parts = Trainer(), [Dump("a"), Dump("b")]
    Components(parts, last=4).out_of_memory(trainer)
    assert [p.seen for p in parts] == [[trainer]] * 2


def test_names_repeat_refused_and_only_components_that_keep_state_are_saved():
    with pytest.raises(ValueError, match="repeat"):
        Components([Measure("a", 1), Measure("a", 2)], last=4)
    assert not keeps_state(Measure("a", 1))

    class Counter(Measure):
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    assert keeps_state(Counter("c", 1))

    class SavesOnly(Measure):  # a state it could not load back is not kept
        def state_dict(self):
            return {}

    assert not keeps_state(SavesOnly("s", 1))


def test_the_registry_saves_every_part_and_refuses_a_checkpoint_without_one():
    state = TrainerState()
    hooks = components(12)
    hooks.pending = ["validation"]
    state.register("work", hooks)
    with pytest.raises(ValueError, match="registered already"):
        state.register("work", hooks)
    saved = state.state_dict()
    assert saved == {"work": {"pending": ["validation"]}}
    hooks.pending = []
    state.load_state_dict(saved)
    assert hooks.pending == ["validation"]
    state.register("other", components(12))
    message = (
        r"no state for work, other \(written by another version of this trainer\): resume it "
        "with that version, or start a new run_dir"
    )
    with pytest.raises(CheckpointFormatError, match=message):
        state.load_state_dict({})
    saved = state.state_dict()
    added = Trainer()  # a component added to a run that has checkpoints starts afresh
    added.state_dict, added.load_state_dict = (lambda: {"n": 1}), added.lines.append
    state.register("added", added, required=False)
    state.load_state_dict(saved)
    assert added.lines == [] and state.state_dict()["added"] == {"n": 1}
    with pytest.raises(CheckpointFormatError, match="not a component"):
        hooks.load_state_dict({"pending": ["unknown"]})


class Tally(Component):
    """A stateful component added from outside (docs/extending.md): counts the steps it saw."""

    name = "tally"
    every = 1

    def __init__(self) -> None:
        self.seen = 0

    def step_end(self, trainer, step: int) -> None:
        self.seen += 1

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


@pytest.mark.slow
@pytest.mark.mutation
def test_a_component_added_to_a_run_with_checkpoints_starts_fresh_and_is_saved(corpus, tmp_path):
    """The resume is not refused for the added part's missing state (a shipped part's is:
    ``TrainerState``'s tests); from then on the part is in every checkpoint."""
    from faults import fault_components
    from train_helpers import run_in_process, tiny_overrides

    overrides = tiny_overrides(corpus, tmp_path)
    assert run_in_process(overrides, fault_components(signal="SIGTERM@6")) == 75
    tally = Tally()
    assert run_in_process(overrides, [tally]) == 0
    assert tally.seen == 12 - 6
    (last,) = tmp_path.glob("checkpoints/step_000012/trainer.json")
    assert json.loads(last.read_text())["tally"] == {"seen": 6}
