"""The one entry point to every check of a configuration before a run starts.

Each section checks its own keys (``settings.Section``): alone when it is built, which refuses
a value that can never work as the config is composed, and with the whole run when
:func:`check_config` asks every section, for the rules that bound one section's key by
another's or by the world size. Before them, the one rule every float setting shares, whoever
owns it: finite (:func:`check_finite`). This module itself checks only what needs the machine:
the files ``data.paths`` names (``data.check_inputs``), the run directory is not a file, the
downstream evaluator's word on its data directory; and, once the device is known
(:func:`check_on_device`) and the tokenizer loaded (:func:`check_against_tokenizer`), what
needs them. It writes nothing into the config: values derived from others (the global batch
from ``trainer.global_batch_tokens``) are computed where they are read
(``ExperimentConfig.sequences_per_step``). What the run directory may refuse (the
checkpoints' configs and bytes) is checked by the trainer's resume, also before anything is
written. Settings that are legal but read by nothing are named, not refused
(:func:`unread_settings`).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import torch

from data import check_inputs, get_source
from settings import Run, check_finite, sections
from training.config import ExperimentConfig, config_value
from training.errors import ConfigError
from training.optim import OPTIMIZERS
from training.runtime.float8 import refusal as float8_refusal
from training.runtime.parallelize import resolve_precision

FETCH = "python -m eval.fetch_benchmarks"  # what writes downstream.data (eval/)


def check_config(config: ExperimentConfig, world_size: int = 1, downstream: Any = None) -> None:
    """Raise ConfigError naming the key when the run cannot work as configured.
    ``downstream``: the evaluator the trainer is handed (``train.py``'s
    ``eval.downstream.InTraining``), or None; where it has a ``check``, that is its word on
    ``downstream.data`` (why it cannot serve the tasks, or None)."""
    check_finite(config)  # first: every range check would let a NaN through
    run = Run(config, world_size)
    for section in sections(config):
        section.check(run)
    try:
        check_inputs(config.data)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    run_dir, d = Path(config.trainer.run_dir), config.downstream
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"trainer.run_dir={run_dir} is a file, not a directory")
    if d.every and downstream is None:
        raise ConfigError(
            f"downstream.every={d.every} needs a downstream evaluator: "
            "train.py passes eval.downstream.InTraining(); from Python, "
            "training.loop.train(config, config_yaml, downstream=InTraining())"
        )
    if d.every and d.data:
        # the evaluator's own word where it has one (which benchmarks the directory holds)
        check = getattr(downstream, "check", None)
        why = check(d.data, list(d.tasks)) if check else None
        if why is None and not Path(d.data).is_dir():
            why = f"no such directory; write the benchmarks there once with `{FETCH} {d.data}`"
        if why:
            raise ConfigError(f"downstream.data={d.data}: {why}")


def _optimizers_own_settings():
    """Each optimizer's own subsection (``optim.muon.*``), read only under its name."""
    for name in OPTIMIZERS:
        own = getattr(ExperimentConfig().optim, name, None)
        if is_dataclass(own):
            keys = tuple(f"optim.{name}.{f.name}" for f in fields(own))
            yield keys, lambda c, name=name: c.optim.name == name, f"optim.name={name}"


# settings read only while another turns their part on: (keys, whether the part is on, what
# turns it on); set away from their defaults while it is off, they change nothing
READ_ONLY_WHEN = (
    *_optimizers_own_settings(),
    (
        ("loss.goldfish_h", "loss.goldfish_rule"),
        lambda c: c.loss.goldfish_k > 0,
        "loss.goldfish_k >= 2",
    ),
    (
        ("spikes.threshold", "spikes.skip", "spikes.skip_limit"),
        lambda c: c.spikes.window > 0,
        "spikes.window >= 2",
    ),
    (
        ("downstream.tasks", "downstream.limit", "downstream.data"),
        lambda c: c.downstream.every > 0,
        "downstream.every >= 1",
    ),
)


def unread_settings(config: ExperimentConfig) -> list[str]:
    """One line naming every setting this run does not read although it is set away from its
    default (AdEMAMix's left by ``recipe=apertus`` under ``optim.name=muon``), or none. Said,
    not refused: a recipe sets a part's knobs whether or not a later override turns it off."""
    default = ExperimentConfig()
    unread = []
    for keys, is_on, turned_on_by in READ_ONLY_WHEN:
        if is_on(config):
            continue
        changed = [k for k in keys if config_value(config, k) != config_value(default, k)]
        unread += [f"{k}={config_value(config, k)!r} (read with {turned_on_by})" for k in changed]
    if not unread:
        return []
    return [f"settings not read by this run, set as they are: {'; '.join(unread)}"]


def check_on_device(config: ExperimentConfig, device: torch.device) -> None:
    """The checks that need the device the run trains on: FP8 matmuls (hardware, torchao,
    bf16), FlexAttention's backward."""
    precision = resolve_precision(config.parallel.precision, device)
    why = float8_refusal(config.parallel.float8, precision, device)
    if why:
        raise ConfigError(why)
    if config.model.attention == "flex" and config.data.document_mask and device.type == "cpu":
        raise ConfigError(
            f"model.attention=flex with data.document_mask: FlexAttention has no backward on a "
            f"CPU (torch {torch.__version__}); use model.attention=auto, which takes the dense "
            "mask there, or sdpa"
        )


def check_against_tokenizer(config: ExperimentConfig, tokenizer: Any) -> None:
    """The checks that need the tokenizer (loaded, before the model is built): the model's
    vocabulary holds its ids, and the data was written by it (token shards)."""
    try:
        config.model.check_vocabulary(tokenizer.vocab_size)
        check = get_source(config.data.source).check_tokenizer
        if check is not None:
            check(config.data, tokenizer)
    except ValueError as error:
        raise ConfigError(str(error)) from None
