"""The step's log line: what the step measured, its speed, and the run's state at that step.

Every ``trainer.log_every`` steps and at the last, on rank 0 (each rank takes part in the two
collectives: the activations' scalars under FSDP, the data counters summed over ranks). The
step's own values (loss, lr, grad_norm, and what components added after the update: skipped
steps, spikes, checkpoint stall) come from ``trainer.record``; the speed from the step's wall
time, the MFU against the device's peak (``logging.peak_flops``; none known for a CPU).
"""

from __future__ import annotations

import math
import time
from typing import Any

from data import counters as data_counters
from data import source_tokens
from model import training_flops_per_token
from training.components import AtStop, Component, Context
from training.instruments.metrics import alpha_scalars, device_peak_flops, peak_memory_gib
from training.runtime import distributed


class StepLog(Component):
    name = "log"
    at_stop = AtStop.NOW  # a stopped step is logged at its step: it is in the checkpoint
    at_last_even_when_off = True  # log_every=0: the last step's line only

    def __init__(
        self, every: int, model_config, seq_len: int, device, peak_flops: float | None = None
    ) -> None:
        self.every = every
        self.flops_per_token = training_flops_per_token(model_config, seq_len)
        self.peak = device_peak_flops(device, peak_flops)
        self.started = self.step_started = time.perf_counter()
        self.start_step = 0

    @classmethod
    def from_context(cls, context: Context) -> StepLog:
        c = context.config
        env, peak = context.env, c.logging.peak_flops
        return cls(c.trainer.log_every, context.model_config, c.data.seq_len, env.device, peak)

    def begin(self, trainer: Any) -> None:
        self.started, self.start_step = time.perf_counter(), trainer.step  # for the ETA

    def step_start(self, trainer: Any, step: int) -> None:
        self.step_started = time.perf_counter()

    def after_update(self, trainer: Any, step: int, stepped: bool) -> None:
        self.step_time = time.perf_counter() - self.step_started

    def step_end(self, trainer: Any, step: int) -> None:
        env, config = trainer.env, trainer.config
        per_layer = trainer.model.activation_scalars()  # a collective under FSDP: every rank
        data_counts = data_counters(trainer.loader.state_dict())  # this rank's streams
        summed = distributed.all_reduce_sum(list(data_counts.values()), env.device)
        if not env.is_main:
            return
        rate = (trainer.step - self.start_step) / max(time.perf_counter() - self.started, 1e-9)
        tokens_per_s = trainer.global_batch * config.data.seq_len / self.step_time
        record = {
            **trainer.record,
            "perplexity": math.exp(min(trainer.record["loss"], 50)),
            "tokens": trainer.tokens,
            "global_batch": trainer.global_batch,  # this step's (trainer.batch_ramp)
            "tokens_per_s": tokens_per_s,
            "step_time_s": self.step_time,
            "memory_gib": peak_memory_gib(env.device),
            "eta_s": (config.trainer.steps - trainer.step) / max(rate, 1e-9),
            **alpha_scalars(per_layer),
            **{f"data/{name}": int(n) for name, n in zip(data_counts, summed, strict=True)},
            **mixture_shares(dict(zip(data_counts, summed, strict=True))),
        }
        if self.peak:
            record["mfu"] = tokens_per_s / env.world_size * self.flops_per_token / self.peak
        trainer.log(record, step=step)
        trainer.logger.log_alpha_table(step, per_layer)  # a wandb figure, not a record


def mixture_shares(counts: dict[str, float]) -> dict[str, float]:
    """``data/share/<name>``: each mixed source's part of the training tokens so far (from the
    counters summed over ranks); empty for a single source."""
    mixed = source_tokens(counts)
    total = sum(mixed.values())
    return {f"data/share/{name}": n / total for name, n in mixed.items()} if total else {}
