"""What several scripts share: timing, bytes saved for backward, tables and CSV files."""

from __future__ import annotations

import csv
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_ms(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int,
    repeats: int,
    min_sample_ms: float = 0.0,
) -> float:
    """Median time of one ``fn`` call in milliseconds, after ``warmup`` untimed calls.

    The device is synchronised around every sample, so CUDA's asynchronous launches are timed to
    their end, not to their queueing. With ``min_sample_ms`` a sample is as many back-to-back
    calls as last that long, divided by their number: while one call's kernels run, the next
    call's Python and launches are already queued, as they are in a training step, where the
    CPU runs ahead of the GPU. Timed one call at a time, a millisecond kernel would also be
    charged the launch overhead the GPU waits for, which no training step pays.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    calls = 1
    if min_sample_ms > 0:
        once = _time_ms(fn, device, 1)
        calls = max(1, math.ceil(min_sample_ms / max(once, 1e-3)))
    return statistics.median(_time_ms(fn, device, calls) for _ in range(repeats))


def median_ms_and_peak_gib(
    fn: Callable[[], object], device: torch.device, warmup: int, repeats: int
) -> tuple[float | None, float | None]:
    """:func:`median_ms`, and the peak of memory allocated on top of what was allocated before,
    in GiB (CUDA only; None elsewhere). (None, None) when ``fn`` runs out of memory: the table
    says OOM for that row and the others still run."""
    cuda = device.type == "cuda"
    try:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if cuda else 0
        ms = median_ms(fn, device, warmup, repeats)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base if cuda else None
    except torch.OutOfMemoryError:
        return None, None
    return ms, None if peak is None else peak / 2**30


def _time_ms(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls


def saved_bytes(step: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct tensors autograd saves for backward during one forward.

    Distinct by storage, offset, shape and dtype: a tensor saved by two ops (the input of a
    residual branch, say) is memory once, and counted once.
    """
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        seen[key] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = step()
    del out
    return sum(seen.values())


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def write_csv(rows: list[dict], path: Path) -> None:
    """Rows as CSV, every key any row has as the header (blank where a row lacks it, as an
    out-of-memory row lacks times); the parent directory is created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
