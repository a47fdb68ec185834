"""Read back what a training run left: its config and its trained model, for eval and export."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from data import load_tokenizer
from model import Llama
from training.checkpoint import complete_checkpoints, single_process_is_intended, step_of
from training.config import ExperimentConfig, to_experiment


def run_config(run_dir: str | Path) -> ExperimentConfig:
    """The resolved config a run saved (``config.yaml``), checked against today's schema."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: no config.yaml")
    schema = OmegaConf.structured(ExperimentConfig)
    return to_experiment(OmegaConf.merge(schema, OmegaConf.load(path)))


def checkpoint_path(run_dir: str | Path, step: int | None = None) -> Path:
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
    """The run's model with a checkpoint's weights (the newest unless ``step``), unwrapped.

    Works in a single process for checkpoints written by any world size (DCP reshards).
    """
    config = run_config(run_dir)
    path = checkpoint_path(run_dir, step)
    vocab = load_tokenizer(config.data.tokenizer).vocab_size
    model = Llama(config.model.with_vocab_from_tokenizer(vocab))
    state = {"model": model.state_dict()}
    with single_process_is_intended():
        dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), config, step_of(path)
