"""The one entry point to every check of a configuration before a run starts.

Each check lives with the keys it checks: the model's and the data's values in their
dataclasses and the sources the data names (``data.check_sources``; all refused when the config
is composed), the files ``data.paths`` names with the sources (``data.check_inputs``), a
schedule's with the schedule (``training.schedule``), the trainer's, optimizer's and logging's
in ``training.config``, and there too the one rule every float setting shares, whoever owns it:
finite (``check_finite``). This module calls them in that order, and itself checks only what
needs the machine (the run directory is not a file; the downstream evaluator's word on its
data directory); it writes nothing into the config: values derived from others (the global
batch from ``trainer.global_batch_tokens``) are computed where they are read
(``ExperimentConfig.sequences_per_step``). The checks that need the tokenizer run once it is
loaded (:func:`check_against_tokenizer`). What the run directory may refuse (the checkpoints'
configs and bytes) is checked by the trainer's resume, also before anything is written.
Settings that are legal but read by nothing are named, not refused (:func:`unread_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from data import check_inputs, get_source
from training.batch_ramp import check_batch_ramp
from training.config import ExperimentConfig, check_finite, check_trainer, config_value
from training.errors import ConfigError
from training.runtime.float8 import refusal as float8_refusal
from training.runtime.parallelize import resolve_precision
from training.schedule import check_schedule

FETCH = "python -m eval.fetch_benchmarks"  # what writes trainer.downstream_data (eval/)


def check_config(config: ExperimentConfig, world_size: int = 1, downstream: Any = None) -> None:
    """Raise ConfigError naming the key when the run cannot work as configured.
    ``downstream``: the evaluator the trainer is handed (``train.py``'s
    ``eval.downstream.InTraining``), or None; where it has a ``check``, that is its word on
    ``trainer.downstream_data`` (why it cannot serve the tasks, or None)."""
    check_finite(config)  # first: every range check below would let a NaN through
    check_trainer(config, world_size)
    check_batch_ramp(config, world_size)
    check_schedule(config.schedule, config.trainer.steps)
    try:
        check_inputs(config.data)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    t = config.trainer
    run_dir, data_dir = Path(t.run_dir), t.downstream_data
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"trainer.run_dir={run_dir} is a file, not a directory")
    if t.downstream_every and downstream is None:
        raise ConfigError(
            f"trainer.downstream_every={t.downstream_every} needs a downstream evaluator: "
            "train.py passes eval.downstream.InTraining(); from Python, "
            "training.loop.train(config, config_yaml, downstream=InTraining())"
        )
    if t.downstream_every and data_dir:
        # the evaluator's own word where it has one (which benchmarks the directory holds)
        check = getattr(downstream, "check", None)
        why = check(data_dir, list(t.downstream_tasks)) if check else None
        if why is None and not Path(data_dir).is_dir():
            why = f"no such directory; write the benchmarks there once with `{FETCH} {data_dir}`"
        if why:
            raise ConfigError(f"trainer.downstream_data={data_dir}: {why}")


# settings read only while another turns their part on: (keys, whether the part is on, what
# turns it on); set away from their defaults while it is off, they change nothing
READ_ONLY_WHEN = (
    (
        (
            "optim.ademamix_alpha",
            "optim.ademamix_beta3",
            "optim.ademamix_alpha_warmup",
            "optim.ademamix_beta3_warmup",
        ),
        lambda c: c.optim.name == "ademamix",
        "optim.name=ademamix",
    ),
    (("optim.muon_lr", "optim.muon_momentum"), lambda c: c.optim.name == "muon", "optim.name=muon"),
    (
        ("optim.goldfish_h", "optim.goldfish_rule"),
        lambda c: c.optim.goldfish_k > 0,
        "optim.goldfish_k >= 2",
    ),
    (
        ("trainer.spike_threshold", "trainer.spike_skip", "trainer.spike_skip_limit"),
        lambda c: c.trainer.spike_window > 0,
        "trainer.spike_window >= 2",
    ),
    (
        ("trainer.downstream_tasks", "trainer.downstream_limit", "trainer.downstream_data"),
        lambda c: c.trainer.downstream_every > 0,
        "trainer.downstream_every >= 1",
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
    precision = resolve_precision(config.trainer.precision, device)
    why = float8_refusal(config.trainer.float8, precision, device)
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
