"""Learning-rate schedules as pure functions of the step (0-based: the step about to be taken),
and the one place that maps ``schedule.name`` to its schedule.

Warmup is linear from ``lr / warmup`` at step 0 to ``lr`` at step ``warmup - 1`` (no step is
taken at lr = 0). The step may be a real number: under a batch ramp the schedule is read at the
step's share of the run's tokens (``training.batch_ramp``), so every formula holds between
whole steps too, and the warmup is capped at the peak (between steps ``warmup - 1`` and
``warmup`` its line would otherwise climb past it).

Adding a schedule is one function of the step and one ``register_schedule(...)`` call: the
config check (``training.checks.check_config``), the trainer and the report scripts all ask
this registry, so there is no second list of names to keep in step. The ``schedule`` section
is defined and checked here (:class:`ScheduleConfig`); a schedule reads ``optim.lr`` and
``optim.min_lr`` from the optimizer's section, which it is handed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from settings import ConfigError, Run, Section, at_least

WSD_DECAY_SHAPES = ("1-sqrt", "linear", "cosine")


@dataclass
class ScheduleConfig(Section):
    """``schedule``: the learning rate's shape over the run (its peak and floor are
    ``optim.lr`` and ``optim.min_lr``).

    Attributes:
        name: a schedule registered here (:func:`register_schedule`): ``wsd``
            (warmup-stable-decay, the paper's main runs) or ``cosine`` (its ablations).
        warmup_steps: linear warmup: step k (0-based) runs at ``lr * (k + 1) / warmup_steps``,
            so the first step takes ``lr / warmup_steps`` (none at 0) and step
            ``warmup_steps - 1`` the peak.
        decay_steps: ``wsd``: length of the cooldown at the end of the run (paper: 14500 of
            70000); ``cosine``: ignored (it decays over all steps after warmup).
        decay_shape: ``wsd`` cooldown: ``1-sqrt`` (paper), ``linear`` or ``cosine`` (checked
            by the wsd schedule itself; other schedules ignore it).
    """

    name: str = "wsd"
    warmup_steps: int = 10
    decay_steps: int = 20
    decay_shape: str = "1-sqrt"

    def check(self, run: Run | None = None) -> None:
        """The schedule's own check runs before the warmup rule every schedule shares, so that
        WSD's ``warmup + decay`` message names both lengths even when the warmup alone is too
        long."""
        at_least("schedule.warmup_steps", self.warmup_steps, 0)
        at_least("schedule.decay_steps", self.decay_steps, 0)
        spec = schedule_spec(self.name)
        if run is None:
            return
        steps = run.config.trainer.steps
        if spec.check is not None:
            spec.check(self, steps)
        if self.warmup_steps > steps:
            raise ConfigError(
                f"schedule.warmup_steps={self.warmup_steps} is longer than trainer.steps={steps}"
            )


def _warmup(step: float, lr: float, warmup: int) -> float:
    """``lr * (step + 1) / warmup``, never above ``lr`` (a real step past ``warmup - 1``)."""
    return lr * min((step + 1) / warmup, 1.0)


def wsd(
    step: float, total: int, lr: float, min_lr: float, warmup: int, decay: int, shape: str
) -> float:
    """Warmup-stable-decay (Hägele et al. 2024; the paper's main runs).

    warmup: lr * min((step + 1) / warmup, 1)                for step < warmup
    stable: lr                                              until decay_start = total - decay
    decay:  min + (lr - min) * f(p), p = (step - decay_start) / decay, for step >= decay_start
            f = 1 - sqrt(p) (``1-sqrt``), 1 - p (``linear``), (1 + cos(pi p)) / 2 (``cosine``)
    """
    if step < warmup:
        return _warmup(step, lr, warmup)
    decay_start = total - decay
    if step < decay_start or decay == 0:  # no cooldown: the peak holds past the end too
        return lr
    p = min((step - decay_start) / decay, 1.0)
    if shape == "1-sqrt":
        f = 1.0 - math.sqrt(p)
    elif shape == "linear":
        f = 1.0 - p
    elif shape == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        raise ValueError(f"schedule.decay_shape={shape!r} is not one of 1-sqrt, linear, cosine")
    return min_lr + (lr - min_lr) * f


def cosine(step: float, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warmup, then min + (lr - min) * (1 + cos(pi p)) / 2 with p = (step - warmup) /
    (total - warmup) (the paper's ablations: 6e-4 -> 6e-5)."""
    if step < warmup:
        return _warmup(step, lr, warmup)
    p = min((step - warmup) / max(total - warmup, 1), 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


Rate = Callable[[float, int, Any, ScheduleConfig], float]


@dataclass(frozen=True)
class Schedule:
    """A registered schedule.

    Attributes:
        name: the value of ``schedule.name``.
        rate: ``(step, total, optim, schedule) -> lr``.
        summary: one line for listings and docs.
        stable_end: ``(schedule, steps) -> step`` where the stable phase ends (the trainer
            validates there and the results tables report it), or None when this config has
            none; the attribute itself is None for a schedule that never has one.
        check: ``(schedule, steps) -> None``: raises ConfigError, naming the keys, for the
            settings only this schedule constrains; None when there are none.
    """

    name: str
    rate: Rate
    summary: str
    stable_end: Callable[[ScheduleConfig, int], int | None] | None = None
    check: Callable[[ScheduleConfig, int], None] | None = None


_SCHEDULES: dict[str, Schedule] = {}


def register_schedule(schedule: Schedule) -> None:
    if schedule.name in _SCHEDULES:
        raise ValueError(f"schedule {schedule.name!r} is registered twice")
    _SCHEDULES[schedule.name] = schedule


def available_schedules() -> list[str]:
    return list(_SCHEDULES)


def schedule_spec(name: str) -> Schedule:
    try:
        return _SCHEDULES[name]
    except KeyError:
        raise ConfigError(f"schedule.name={name!r} is not one of {', '.join(_SCHEDULES)}") from None


def stable_phase_end(schedule: ScheduleConfig, steps: int) -> int | None:
    """The step at which the stable phase of a ``steps``-step run ends (WSD: where its cooldown
    starts), or None when it has none (cosine, or WSD without a cooldown). The one definition
    the trainer's validation steps and the report scripts share."""
    spec = schedule_spec(schedule.name)
    return spec.stable_end(schedule, steps) if spec.stable_end is not None else None


def learning_rate(step: float, total: int, optim: Any, schedule: ScheduleConfig) -> float:
    """The rate of the registered schedule ``schedule.name`` at ``step`` of ``total``."""
    return schedule_spec(schedule.name).rate(step, total, optim, schedule)


def _wsd_rate(step: float, total: int, optim: Any, schedule: ScheduleConfig) -> float:
    return wsd(
        step,
        total,
        optim.lr,
        optim.min_lr,
        schedule.warmup_steps,
        schedule.decay_steps,
        schedule.decay_shape,
    )


def _wsd_stable_end(schedule: ScheduleConfig, steps: int) -> int | None:
    # decay_steps = 0: no cooldown, so no stable phase distinct from the end of the run
    return steps - schedule.decay_steps if schedule.decay_steps else None


def _wsd_check(schedule: ScheduleConfig, steps: int) -> None:
    if schedule.decay_shape not in WSD_DECAY_SHAPES:
        raise ConfigError(
            f"schedule.decay_shape={schedule.decay_shape!r} is not one of "
            f"{', '.join(WSD_DECAY_SHAPES)}"
        )
    if schedule.warmup_steps + schedule.decay_steps > steps:
        raise ConfigError(
            f"schedule.warmup_steps={schedule.warmup_steps} + schedule.decay_steps="
            f"{schedule.decay_steps} is longer than trainer.steps={steps}"
        )


def _cosine_rate(step: float, total: int, optim: Any, schedule: ScheduleConfig) -> float:
    return cosine(step, total, optim.lr, optim.min_lr, schedule.warmup_steps)


register_schedule(
    Schedule(
        "wsd",
        _wsd_rate,
        "warmup, constant, then a 1-sqrt / linear / cosine cooldown (the paper's main runs)",
        stable_end=_wsd_stable_end,
        check=_wsd_check,
    )
)
register_schedule(
    Schedule("cosine", _cosine_rate, "warmup, then cosine to optim.min_lr (the ablations)")
)
