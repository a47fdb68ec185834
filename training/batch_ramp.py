"""The global batch of every step, and where each step stands in the run's tokens.

``trainer.batch_ramp`` lists ``(tokens, global_batch)`` stages, as large runs ramp their batch
(Megatron's ``--rampup-batch-size``; Apertus 8B: 1024 -> 2048 sequences partway through). A
stage starts at the first step whose consumed tokens reach its count, so the batch of every
step is a function of the step alone (:class:`BatchPlan`): a resume, on any world size, takes
the same batch at the same step, and the data pipeline, which deals micro-batches, resumes to
the token whatever the batch (a larger batch only draws more micro-batches per step).

The learning-rate schedule is a function of the step (``training.schedule``). With a ramp the
steps no longer take equal shares of the run's tokens, so the schedule is read at the step's
position in the tokens, ``steps * tokens_before(step) / tokens_before(steps)`` (Megatron decays
by samples too): warmup and cooldown cover the same share of the data as without a ramp.
Without a ramp that position is the step itself, exactly, and nothing changes.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from settings import ConfigError


@dataclass
class RampStage:
    """One stage of ``trainer.batch_ramp``: from the first optimizer step that starts with at
    least ``tokens`` training tokens consumed, the global batch is ``global_batch`` sequences."""

    tokens: int = 0
    global_batch: int = 1


class BatchPlan:
    """Every step's global batch and the tokens consumed before it, from the config."""

    def __init__(self, config: Any, world_size: int = 1) -> None:
        self.seq_len, self.steps = config.data.seq_len, config.trainer.steps
        self.per_micro_batch = config.trainer.micro_batch * world_size  # sequences, all ranks
        self.ramped, self.ramp = bool(config.trainer.batch_ramp), config.trainer.batch_ramp
        # (first step, tokens before it, batch) of each stage that starts
        self.stages = [(0, 0, config.sequences_per_step)]
        for stage in config.trainer.batch_ramp:
            step, tokens, batch = self.stages[-1]
            per_step = batch * self.seq_len
            start = step + max(math.ceil((stage.tokens - tokens) / per_step), 0)
            self.stages.append((start, tokens + (start - step) * per_step, stage.global_batch))
        self.starts = [start for start, _, _ in self.stages]

    def _stage(self, step: int) -> tuple[int, int, int]:
        return self.stages[bisect.bisect_right(self.starts, step) - 1]

    def warnings(self) -> list[str]:
        """A stage whose batch is smaller than the one before it, or that starts at or after
        the run's last token: run as asked (a smaller batch for the cooldown is a choice some
        make; a ramp written for a longer run) but said at the start, since each is more often
        a typo. The trainer logs these."""
        batches = [batch for _, _, batch in self.stages]  # the base, then each stage's
        said = [
            f"trainer.batch_ramp[{i}].global_batch={batches[i + 1]} is smaller than the "
            f"{batches[i]} before it: the batch shrinks there, as asked"
            for i in range(len(batches) - 1)
            if batches[i + 1] < batches[i]
        ]
        last = self.tokens_before(self.steps)
        said += [
            f"trainer.batch_ramp[{i}] starts at {stage.tokens} tokens, which this run never "
            f"reaches: it ends at {last} tokens (trainer.steps={self.steps})"
            for i, stage in enumerate(self.ramp)
            if stage.tokens >= last
        ]
        return said

    def batch(self, step: int) -> int:
        """The global batch (sequences) of ``step`` (0-based: the step about to be taken)."""
        return self._stage(step)[2]

    def at(self, step: int) -> tuple[int, int]:
        """(global batch, micro-batches per rank) of ``step``."""
        batch = self.batch(step)
        return batch, batch // self.per_micro_batch

    def tokens_before(self, step: int) -> int:
        """Training tokens consumed by the steps before ``step``."""
        start, tokens, batch = self._stage(step)
        return tokens + (step - start) * batch * self.seq_len

    def position(self, step: int) -> float:
        """Where the schedule reads ``step``: the step itself without a ramp, else its share of
        the run's tokens in steps."""
        if not self.ramped:
            return step
        return self.steps * self.tokens_before(step) / self.tokens_before(self.steps)

    def step_at(self, position: int | None) -> int | None:
        """The first step the schedule reads at ``position`` or later (e.g. the stable phase's
        end); None stays None."""
        if position is None or not self.ramped:
            return position
        return bisect.bisect_left(range(self.steps + 1), position, key=self.position)


def check_batch_ramp(config: Any, world_size: int) -> None:
    """Raise ConfigError naming the stage when a ramp cannot run on ``world_size`` ranks."""
    per_step = config.trainer.micro_batch * world_size
    previous = 0
    for i, stage in enumerate(config.trainer.batch_ramp):
        key = f"trainer.batch_ramp[{i}]"
        if stage.tokens <= previous:
            raise ConfigError(
                f"{key}.tokens={stage.tokens} must be positive and above the stage before's "
                f"({previous}): stages are listed in the order they start"
            )
        if stage.global_batch < 1 or stage.global_batch % per_step:
            raise ConfigError(
                f"{key}.global_batch={stage.global_batch} is not a positive multiple of "
                f"trainer.micro_batch={config.trainer.micro_batch} x world size {world_size}"
            )
        previous = stage.tokens
