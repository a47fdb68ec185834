"""Which steps update, and when a run gives up: non-finite steps and loss spikes.

A step whose loss or gradient norm is not finite is skipped and counted; ``spikes.max_bad_steps`` of
them in a row stop the run without checkpointing, since the weights may be damaged and the
last checkpoint is good. A spike (``training.instruments.spikes``) is counted and reported, and its
update skipped only with ``spikes.skip``. Every rank reaches the same verdict: the trainer
sums the loss over ranks before asking, and the gradient norm is already global.

Skipping spikes must never stop learning for good: a skipped step's values stay out of the
window, so after a lasting shift of the level (a gradient norm moving from 1.0 to 1.2 after a
learning-rate change) every later step would be a "spike" and skipped, and the run would end
with exit 0 having learned nothing. So ``spikes.skip_limit`` spikes in a row are taken
as a new level, not a burst: their values join the window, the step is applied, and a warning
says so. Adapting, rather than stopping the run, keeps a healthy run going through a change of
regime; a run that really diverges still ends through the non-finite rule.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from settings import ConfigError, Run, Section, at_least, positive
from training.components import Component, Context
from training.errors import NonFiniteTrainingError
from training.instruments.spikes import Spike, SpikeMonitor

log = logging.getLogger(__name__)


@dataclass
class SpikesConfig(Section):
    """``spikes``: which steps update, and when a run gives up.

    Attributes:
        window: steps of the rolling window a step's loss and gradient norm are compared with
            (``training/instruments/spikes.py``); 0 disables the monitor. Spikes are counted
            (``spikes``) and reported with their step and value.
        threshold: how many standard deviations above the window's mean make a spike.
        skip: skip the update of a spike step (counted in ``skipped_steps``); off by default.
        skip_limit: with ``skip``, this many spikes in a row are a new level, not a burst: the
            step is applied and their values join the window, so a lasting shift (a
            learning-rate change) never freezes the run.
        max_bad_steps: stop after this many consecutive steps with a non-finite loss or
            gradient (with or without the monitor).
    """

    window: int = 100
    threshold: float = 6.0
    skip: bool = False
    skip_limit: int = 5
    max_bad_steps: int = 5

    def check(self, run: Run | None = None) -> None:
        at_least("spikes.window", self.window, 0)
        if self.window == 1:
            raise ConfigError(f"spikes.window={self.window} must be 0 (off) or >= 2")
        positive("spikes.threshold", self.threshold)
        at_least("spikes.skip_limit", self.skip_limit, 1)
        at_least("spikes.max_bad_steps", self.max_bad_steps, 1)


class StepHealth(Component):
    """The trainer's ``health`` component: its verdict before each update, its count after."""

    name = "health"

    @classmethod
    def from_context(cls, context: Context) -> StepHealth:
        s = context.config.spikes
        spikes = SpikeMonitor(s.window, s.threshold) if s.window else None
        rates = " or ".join(context.config.optim.rate_keys)
        return cls(s.max_bad_steps, spikes, s.skip, s.skip_limit, rates)

    def __init__(
        self,
        max_bad_steps: int,
        spikes: SpikeMonitor | None,
        skip_spikes: bool,
        skip_limit: int = 5,
        rates: str = "optim.lr",
    ) -> None:
        """``rates``: the settings a run that diverges should lower, named in the stop."""
        self.max_bad_steps, self.spikes, self.skip_spikes = max_bad_steps, spikes, skip_spikes
        self.skip_limit, self.rates = skip_limit, rates
        self.skipped = 0  # updates skipped over the run, for any reason
        self.bad_in_a_row = 0  # consecutive non-finite steps
        self.spikes_in_a_row: list[dict[str, float]] = []  # the values of skipped spikes
        self.found: list[Spike] = []  # the spikes of the step being judged
        self.new_level = False  # the step being judged ended a run of skipped spikes
        self.spike_skipped = False  # the step being judged is a skipped spike

    def before_update(self, trainer: Any, step: int, loss: float, grad_norm: float) -> bool:
        return self.should_update(loss, grad_norm)

    def after_update(self, trainer: Any, step: int, stepped: bool) -> None:
        record = trainer.record
        self.settle(step, stepped, record["loss"], record["grad_norm"], trainer.env.is_main)
        record["skipped_steps"] = self.skipped
        if self.spike_count is not None:
            record["spikes"] = self.spike_count

    def should_update(self, loss: float, grad_norm: float) -> bool:
        """The verdict on a step, given before its update."""
        self.found, self.new_level, self.spike_skipped = [], False, False
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return False
        if self.spikes is None:
            return True
        values = {"loss": loss, "grad_norm": grad_norm}
        self.found = self.spikes.check(values)
        if self.found and self.skip_spikes:
            if len(self.spikes_in_a_row) + 1 < self.skip_limit:
                self.spikes_in_a_row.append(values)
                self.spike_skipped = True
                return False  # its values stay out of the window
            self.new_level = True  # a lasting shift: the burst joins the window
            for earlier in self.spikes_in_a_row:
                self.spikes.record(earlier)
        self.spikes_in_a_row = []
        self.spikes.record(values)
        return True

    def settle(self, step: int, stepped: bool, loss: float, grad_norm: float, report: bool) -> None:
        """Count step ``step`` (1-based) once it is taken or skipped; ``report``: whether this
        rank writes the spike warnings (rank 0). Raises ``NonFiniteTrainingError`` at the
        ``max_bad_steps``-th non-finite step in a row."""
        for spike in self.found if report else []:
            action = ""
            if self.new_level:
                action = (
                    f"; update applied: {self.skip_limit} spikes in a row "
                    "(spikes.skip_limit) are taken as a new level, which joins the window"
                )
            elif self.skip_spikes:
                action = "; update skipped (spikes.skip)"
            log.warning(
                "step %d: %s spike %.4g, %.1f standard deviations above the mean %.4g of the "
                "last %d steps%s",
                step,
                spike.metric,
                spike.value,
                spike.zscore,
                spike.mean,
                len(self.spikes.history[spike.metric]),
                action,
            )
        if stepped:
            self.bad_in_a_row = 0
            return
        self.skipped += 1
        if self.spike_skipped:
            return
        self.bad_in_a_row += 1
        log.warning(
            "step %d: non-finite loss %s or gradient norm %s; update skipped (%d in a row)",
            step,
            loss,
            grad_norm,
            self.bad_in_a_row,
        )
        if self.bad_in_a_row >= self.max_bad_steps:
            raise NonFiniteTrainingError(
                f"{self.bad_in_a_row} consecutive steps had a non-finite loss or gradient "
                f"(spikes.max_bad_steps={self.max_bad_steps}); stopping without checkpointing. "
                f"Lower {self.rates}, check the data, or resume from the last checkpoint."
            )

    @property
    def spike_count(self) -> int | None:
        return None if self.spikes is None else self.spikes.count

    def state_dict(self) -> dict:
        """Everything a later verdict depends on, the spike window included: a resumed run
        skips exactly the steps the uninterrupted run skips."""
        return {
            "skipped": self.skipped,
            "bad_in_a_row": self.bad_in_a_row,
            "spikes_in_a_row": [dict(v) for v in self.spikes_in_a_row],
            "spikes": None if self.spikes is None else self.spikes.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.bad_in_a_row = state["skipped"], state["bad_in_a_row"]
        self.spikes_in_a_row = [dict(v) for v in state["spikes_in_a_row"]]
        if self.spikes is not None and state["spikes"] is not None:
            self.spikes.load_state_dict(state["spikes"])
