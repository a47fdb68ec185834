"""Learning-rate schedules as pure functions of the step (0-based: the step about to be taken).

Warmup is linear from ``lr / warmup`` at step 0 to ``lr`` at step ``warmup - 1`` (no step is
taken at lr = 0).
"""

from __future__ import annotations

import math

from training.config import OptimConfig, ScheduleConfig


def wsd(
    step: int, total: int, lr: float, min_lr: float, warmup: int, decay: int, shape: str
) -> float:
    """Warmup-stable-decay (Hägele et al. 2024; the paper's main runs).

    warmup: lr * (step + 1) / warmup                        for step < warmup
    stable: lr                                              until decay_start = total - decay
    decay:  min + (lr - min) * f(p), p = (step - decay_start) / decay, for step >= decay_start
            f = 1 - sqrt(p) (``1-sqrt``), 1 - p (``linear``), (1 + cos(pi p)) / 2 (``cosine``)
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_start = total - decay
    if step < decay_start:
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


def cosine(step: int, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warmup, then min + (lr - min) * (1 + cos(pi p)) / 2 with p = (step - warmup) /
    (total - warmup) (the paper's ablations: 6e-4 -> 6e-5)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min((step - warmup) / max(total - warmup, 1), 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def learning_rate(step: int, total: int, optim: OptimConfig, schedule: ScheduleConfig) -> float:
    if schedule.name == "wsd":
        return wsd(
            step,
            total,
            optim.lr,
            optim.min_lr,
            schedule.warmup_steps,
            schedule.decay_steps,
            schedule.decay_shape,
        )
    return cosine(step, total, optim.lr, optim.min_lr, schedule.warmup_steps)
