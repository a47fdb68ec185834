"""Where numbers go: the console, ``metrics.jsonl`` in the run directory, and wandb.

Every scalar goes to all three with the same key, so plots need no wandb. MFU is reported only
where the device's peak is known; there is no guessed number for CPUs or unknown GPUs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from settings import Run, Section, at_least, one_of, positive


@dataclass
class WandbConfig(Section):
    """``logging.wandb``. ``mode``: ``online``, ``offline`` (files only, sync later: works with
    no network) or ``disabled``; ``WANDB_MODE`` in the environment, when set, takes its place."""

    mode: str = "offline"
    project: str = "xielu"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)

    def check(self, run: Run | None = None) -> None:
        one_of("logging.wandb.mode", self.mode, ("online", "offline", "disabled"))


@dataclass
class LoggingConfig(Section):
    """``logging``: where numbers go, and the per-layer measurements' cadences.

    Attributes:
        wandb: the wandb run (:class:`WandbConfig`).
        diagnostics_every: steps between the per-layer activation diagnostics (the MLP
            pre-activation RMS, its fraction below zero, the output RMS and the non-linear share
            of the output; ``training/instruments/diagnostics.py``), measured on one fixed
            held-out batch, also at step 0; 0 disables. Each costs one forward of
            ``trainer.micro_batch`` sequences.
        grad_norms_every: steps between the per-layer gradient norms (attention, MLP and the
            activation's scalars of every block, before clipping;
            ``training/instruments/grad_norms.py``), logged as ``grad_norm/<group>/layer_NN``;
            0 disables.
        outliers_every: steps between the per-layer outlier telemetry (kurtosis, max/RMS and
            the FP8 scaling units' maxima of the MLP's pre-activation and output, the attention
            output and the residual stream; ``training/instruments/outliers.py``), on that
            step's own micro-batches, logged as ``outliers/<tensor>/<statistic>/layer_NN``; 0
            disables. That step's forward runs eagerly.
        peak_flops: the device's dense peak FLOP/s the logged ``mfu`` divides by; None takes
            it from :data:`PEAK_BF16_FLOPS` for a GPU listed there and logs no MFU elsewhere
            (a CPU, a GPU the table does not list: set it from the vendor's data sheet).
    """

    wandb: WandbConfig = field(default_factory=WandbConfig)
    diagnostics_every: int = 50
    grad_norms_every: int = 50
    outliers_every: int = 50
    peak_flops: float | None = None

    def check(self, run: Run | None = None) -> None:
        for key in ("diagnostics_every", "grad_norms_every", "outliers_every"):
            at_least(f"logging.{key}", getattr(self, key), 0)
        if self.peak_flops is not None:
            positive("logging.peak_flops", self.peak_flops)


log = logging.getLogger(__name__)

# dense bf16 peak FLOP/s per device, from the vendors' data sheets (half the "with sparsity"
# figure); the first key contained in the device's name wins, so variants come first
PEAK_BF16_FLOPS = {
    "GH200": 989e12,  # the Hopper GPU of a Grace Hopper superchip (H100 SXM class)
    "H200 NVL": 835e12,  # the PCIe card: lower clocks and power than the SXM module
    "H200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "A100": 312e12,
}


def peak_flops_of(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its CUDA name; None for a device not in the table."""
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return peak
    return None


def device_peak_flops(device: torch.device, given: float | None = None) -> float | None:
    """``logging.peak_flops`` when given, else the table's for a listed GPU."""
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def alpha_scalars(per_layer: list[dict[str, float]]) -> dict[str, float]:
    """``alpha_p/layer_00``-style keys for every layer's activation scalars."""
    out = {}
    for i, scalars in enumerate(per_layer):
        for name, value in scalars.items():
            out[f"{name}/layer_{i:02d}"] = value
    return out


SUPERSEDED_FILE = "metrics.superseded.jsonl"


def supersede_records_after(path: Path, resumed_at: int | None) -> int | None:
    """Move the records a resume will log again out of ``metrics.jsonl``; return the highest
    step logged so far (None: none).

    A run resumed at step S trains S+1, S+2, ... again: what the interrupted attempt logged
    past S (or anything, on a fresh start, ``resumed_at`` None) would otherwise be there twice.
    Those records go to ``metrics.superseded.jsonl`` (kept for a post-mortem, never read by the
    reports), a line cut short by a kill with them, and ``metrics.jsonl`` is rewritten whole
    (a temporary file renamed over it), so every reader sees each step once.
    """
    if not path.is_file():
        return None
    kept, superseded, highest = [], [], None
    for line in path.read_text().splitlines():
        try:
            step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            superseded.append(line)  # cut short: the process died while writing it
            continue
        highest = step if highest is None else max(highest, step)
        keep = resumed_at is not None and step <= resumed_at
        (kept if keep else superseded).append(line)
    if superseded:
        with open(path.with_name(SUPERSEDED_FILE), "a") as f:
            f.write(json.dumps({"superseded_at_resume_from": resumed_at}) + "\n")
            f.writelines(line + "\n" for line in superseded)
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)
    return highest


class MetricsLogger:
    """Rank 0 only: console lines, metrics.jsonl, and wandb when enabled.

    ``resumed_at``: the step a resume starts from (None: a fresh start); what was logged past
    it is superseded (:func:`supersede_records_after`), and wandb, which keeps what it was sent,
    is not sent again the steps it already has (it would drop them with a warning): it shows
    the first attempt's values for those, ``metrics.jsonl`` the resumed run's.
    """

    def __init__(
        self,
        run_dir: Path,
        wandb_config: WandbConfig,
        config_dict: dict,
        name: str,
        resumed_at: int | None = None,
    ):
        self.path = run_dir / "metrics.jsonl"
        highest = supersede_records_after(self.path, resumed_at)
        self.wandb_has_through = -1 if highest is None else highest
        self.file = self.path.open("a")
        self.wandb = None
        mode = wandb_mode(wandb_config)
        if mode != "disabled":
            try:
                import wandb

                self.wandb = wandb.init(
                    project=wandb_config.project,
                    entity=wandb_config.entity,
                    name=wandb_config.name or name,
                    group=wandb_config.group,
                    tags=list(wandb_config.tags),
                    mode=mode,
                    dir=str(run_dir),
                    config=config_dict,
                    resume="allow",
                    id=_run_id(run_dir),
                )
            except Exception as error:  # never lose a training run to a logging backend
                log.error("wandb could not start (%s); logging to metrics.jsonl only", error)

    def log(self, step: int, metrics: dict, console: bool = True) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb is not None and step > self.wandb_has_through:
            self.wandb.log(metrics, step=step)
        if console:
            print(format_line(step, metrics), file=sys.stdout, flush=True)

    def log_alpha_table(self, step: int, per_layer: list[dict[str, float]]) -> None:
        """The paper's learned-alpha-by-depth figure as a wandb table and line plot."""
        if self.wandb is None or not per_layer or not per_layer[0]:
            return
        if step <= self.wandb_has_through:
            return
        import wandb

        names = sorted(per_layer[0])
        n = len(per_layer)
        rows = [[i, i / max(n - 1, 1), *(s[k] for k in names)] for i, s in enumerate(per_layer)]
        table = wandb.Table(columns=["layer", "depth", *names], data=rows)
        charts = {
            f"alpha_by_depth/{k}": wandb.plot.line(table, "depth", k, title=f"{k} vs depth")
            for k in names
        }
        self.wandb.log({"alpha_by_depth/table": table, **charts}, step=step)

    def close(self) -> None:
        self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


def wandb_mode(config: WandbConfig) -> str:
    """``WANDB_MODE`` from the environment when set (a cluster's or a test's way to turn wandb
    off for every run, as wandb's own tools read it), else ``logging.wandb.mode``."""
    return os.environ.get("WANDB_MODE") or config.mode


def _run_id(run_dir: Path) -> str:
    """The same wandb run id across resumes of one run directory."""
    id_file = run_dir / "wandb_run_id"
    if id_file.is_file():
        return id_file.read_text().strip()
    run_id = secrets.token_hex(4)
    id_file.write_text(run_id)
    return run_id


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def format_line(step: int, m: dict) -> str:
    parts = [f"step {step:>6}"]
    for key, fmt in (
        ("loss", "loss {:.4f}"),
        ("val/loss", "val {:.4f}"),
        ("lr", "lr {:.2e}"),
        ("grad_norm", "gnorm {:.3f}"),
        ("tokens_per_s", "{:,.0f} tok/s"),
        ("mfu", "mfu {:.1%}"),
        ("eta_s", "eta {}"),
    ):
        if key in m and m[key] is not None:
            value = m[key]
            if key == "eta_s":
                value = _duration(value)
            parts.append(fmt.format(value))
    return " | ".join(parts)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
