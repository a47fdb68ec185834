"""Loss and gradient-norm spikes: a rolling z-score over the recent steps.

A spike is a step whose loss (or global gradient norm) lies more than ``threshold`` standard
deviations above the mean of the previous ``window`` steps. Only upward jumps count: a loss
that falls fast early in training is not a spike. Detection starts once ``MIN_HISTORY`` steps
are known. Spikes are counted (``spikes`` in ``metrics.jsonl`` and wandb), each is reported with
its step and value, and with ``spikes.skip`` the step's update is skipped; a skipped
step's values stay out of the window, so a burst of bad steps does not become the new normal,
until ``training.step_health`` decides that a long enough burst is the new normal.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

MIN_HISTORY = 10


@dataclass(frozen=True)
class Spike:
    metric: str  # "loss" or "grad_norm"
    value: float
    zscore: float
    mean: float


class SpikeMonitor:
    def __init__(self, window: int, threshold: float) -> None:
        if window < 2 or threshold <= 0:
            raise ValueError(
                "a spike window needs >= 2 steps and a positive threshold, got "
                f"{window}, {threshold}"
            )
        self.threshold = threshold
        self.history = {"loss": deque(maxlen=window), "grad_norm": deque(maxlen=window)}
        self.count = 0

    def check(self, values: dict[str, float]) -> list[Spike]:
        """The spikes among this step's ``{"loss": ..., "grad_norm": ...}`` against the
        window; the values do not enter the window yet (:meth:`record` does)."""
        found = []
        for metric, value in values.items():
            past = self.history[metric]
            if len(past) < MIN_HISTORY or not math.isfinite(value):
                continue
            mean, std = statistics.fmean(past), statistics.pstdev(past)
            if std == 0:
                continue
            z = (value - mean) / std
            if z > self.threshold:
                found.append(Spike(metric, value, z, mean))
        self.count += bool(found)
        return found

    def state_dict(self) -> dict:
        """The window and the count: a resumed run judges its next step as the uninterrupted
        run would (JSON values, for the checkpoint's ``trainer.json``)."""
        return {"count": self.count, "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]
        for metric, values in state["history"].items():
            self.history[metric].clear()
            self.history[metric].extend(values)  # a shorter window keeps the newest values

    def record(self, values: dict[str, float]) -> None:
        """Add a step's values to the window (finite ones only)."""
        for metric, value in values.items():
            if math.isfinite(value):
                self.history[metric].append(value)
