"""Validation loss: the one loop behind the trainer's evaluations and ``eval.perplexity``.

Loss is summed over every target token on every rank and divided once, so the number does not
depend on batch size or world size. Ranks can hold different numbers of validation batches, but
under DDP/FSDP every forward is a collective: all ranks run the same number of forwards, the
short ones padding with batches whose targets are all ignored.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable

import torch
from tqdm import tqdm

from data import IGNORE_INDEX
from training.runtime import distributed


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module,
    batches: Iterable[dict],
    device: torch.device,
    batch_shape: tuple[int, int],
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    progress: bool = False,
) -> dict:
    """Token-weighted mean loss over this rank's ``batches`` and every other rank's.

    ``batch_shape`` (batch, seq) shapes the padding batches. Returns loss, perplexity and the
    number of target tokens; ``tokens == 0`` when the validation slice is empty.
    """
    batches = list(batches)
    rounds = int(distributed.all_reduce_max([float(len(batches))], device)[0])
    padding = {
        "inputs": torch.zeros(batch_shape, dtype=torch.long),
        "targets": torch.full(batch_shape, IGNORE_INDEX, dtype=torch.long),
    }
    total, count = 0.0, 0.0
    for i in tqdm(range(rounds), desc="validation", unit="batch", disable=not progress):
        batch = batches[i] if i < len(batches) else padding
        batch = {k: v.to(device) for k, v in batch.items()}
        n = float((batch["targets"] != IGNORE_INDEX).sum())
        with autocast():
            loss = model(batch["inputs"], batch["targets"], batch.get("document_ids"))
        total += float(loss) * n
        count += n
    total, count = distributed.all_reduce_sum([total, count], device)
    loss = total / count if count else math.nan
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), "tokens": int(count)}
