"""A tiny model and optimizer to checkpoint, a pickle payload, and a one-call synchronous save."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import torch

from model import Llama, ModelConfig
from training.checkpoint import CheckpointWriter
from training.runtime.distributed import Env

ENV = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class Payload:
    """Unpickling this creates ``marker``: proof that a load ran code from the file."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def tiny_model_and_optimizer():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=128, dim=32, n_layers=2, n_heads=2, gated_hidden=64, max_seq_len=32
    )
    model = Llama(config)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": params[:4], "weight_decay": 0.1}, {"params": params[4:], "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
    )
    return model, optimizer


def train_a_step(model, optimizer) -> None:
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()


def save_checkpoint(
    run_dir, step, model, optimizer, trainer_state, data_state, config_yaml, env=ENV, keep=3
) -> Path:
    """One synchronous save, published when it returns (what the trainer's writer does)."""
    writer = CheckpointWriter(run_dir, env, keep, asynchronous=False)
    return writer.save(step, model, optimizer, trainer_state, data_state, config_yaml)
