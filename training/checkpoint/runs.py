"""Read back what a training run left: its config and its trained model, for eval and export.

A run's configuration is that of its newest checkpoint (each checkpoint holds the config of the
run that wrote it), so a later start that was refused, or one that changed what a resume may
change, never makes a reader take settings the weights were not trained with.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf

from data import load_tokenizer
from model import Llama
from training.checkpoint import integrity
from training.checkpoint.layout import (
    CONFIG_FILE,
    complete_checkpoints,
    single_process_is_intended,
    step_of,
)
from training.checkpoint.load import is_damage
from training.checkpoint.unpickling import dcp_load
from training.errors import NoLoadableCheckpointError
from training.renamed_keys import upgrade
from training.runtime.distributed import Env

if TYPE_CHECKING:  # the package is imported while training.config is (its sections)
    from training.config import ExperimentConfig

log = logging.getLogger(__name__)
_ONE_PROCESS = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def run_config(run_dir: str | Path) -> ExperimentConfig:
    """The run's config: its newest checkpoint's, or the run directory's ``config.yaml`` while
    it has no checkpoint, checked against today's schema."""
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        if _holds_config(checkpoint):
            try:
                return checkpoint_config(checkpoint)
            except Exception as error:  # damaged: the one before says what ran
                log.warning("%s cannot be read (%s)", checkpoint / CONFIG_FILE, error)
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: no {CONFIG_FILE}")
    return config_from_file(path)


def _holds_config(checkpoint: Path) -> bool:
    file = checkpoint / CONFIG_FILE
    return file.is_file() and file.stat().st_size > 0


def checkpoint_config(checkpoint: Path) -> ExperimentConfig:
    """The config of the run that wrote ``checkpoint``."""
    return config_from_file(checkpoint / CONFIG_FILE)


def config_from_file(path: Path) -> ExperimentConfig:
    """A saved ``config.yaml`` in today's layout: its moved keys in their new places, its
    renamed values and dropped keys brought up to date (``training.renamed_keys.upgrade``)."""
    from training.config import ExperimentConfig, to_experiment  # see TYPE_CHECKING above

    saved = OmegaConf.to_container(OmegaConf.load(path))
    schema = OmegaConf.structured(ExperimentConfig)
    return to_experiment(OmegaConf.merge(schema, upgrade(saved)), initial_weights=False)


def checkpoint_path(run_dir: str | Path, step: int | None = None) -> Path:
    """The published checkpoint at ``step``, or the newest one.

    A lookup only: whether it loads is known by loading it, so the fallback to an older
    checkpoint when the newest is damaged lives in :func:`load_trained_model`.
    """
    found = complete_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"{run_dir} has no complete checkpoint")
    if step is None:
        return found[-1]
    for path in found:
        if step_of(path) == step:
            return path
    have = ", ".join(p.name for p in found)
    raise FileNotFoundError(f"{run_dir} has no checkpoint at step {step}; it has: {have}")


def load_trained_model(
    run_dir: str | Path, step: int | None = None, device: str | torch.device = "cpu"
) -> tuple[Llama, ExperimentConfig, int]:
    """The run's model with a checkpoint's weights, unwrapped, with the config of the run that
    wrote that checkpoint, and the checkpoint's step.

    With ``step``, that checkpoint or an error. Without, the newest checkpoint that loads: one
    whose bytes are damaged (``training.checkpoint.integrity``) is skipped with a warning and
    the one before it is used. Unlike the trainer's resume, evaluation and export never rename it:
    they only read the run directory, possibly while the run is still training; the trainer
    sets it aside as ``.corrupt`` on its next resume. Nothing in the files runs code
    (``training.checkpoint.unpickling``). Works in a single process for checkpoints written by
    any world size (DCP reshards).
    """
    fallback = run_config(run_dir)
    if step is not None:
        candidates = [checkpoint_path(run_dir, step)]
    else:
        candidates = list(reversed(complete_checkpoints(run_dir)))
        if not candidates:
            raise FileNotFoundError(f"{run_dir} has no complete checkpoint")
    failures: list[tuple[Path, str]] = []
    for path in candidates:
        try:
            integrity.verify(path, _ONE_PROCESS)
            config = checkpoint_config(path) if _holds_config(path) else fallback
            vocab = load_tokenizer(config.data.tokenizer).vocab_size
            model = Llama(config.model.with_vocab_from_tokenizer(vocab))
            state = {"model": model.state_dict()}
            with single_process_is_intended():
                dcp_load(state, path)
            model.load_state_dict(state["model"])
        except Exception as error:
            if step is not None or not is_damage(error):
                raise
            reason = f"{type(error).__name__}: {error}"
            log.warning("skipping %s, which cannot be loaded: %s", path, reason)
            failures.append((path, reason))
            continue
        return model.to(device).eval(), config, step_of(path)
    raise NoLoadableCheckpointError(run_dir, failures, "there is no model to load")
