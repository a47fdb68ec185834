"""The one entry point to every check of a configuration before a run starts.

Each check lives with the keys it checks: the model's and the data's values in their
dataclasses (refused when the config is composed), the files ``data.paths`` names with the data
(``DataConfig.check_inputs``), a schedule's with the schedule (``training.schedule``), the
trainer's, optimizer's and logging's in ``training.config``. This module only calls them, in
that order, and writes nothing into the config: values derived from others (the global batch
from ``trainer.global_batch_tokens``) are computed where they are read
(``ExperimentConfig.sequences_per_step``). What the run directory may refuse (the checkpoints'
configs and bytes) is checked by the trainer's resume, also before anything is written.
"""

from __future__ import annotations

from training.config import ConfigError, ExperimentConfig, check_trainer
from training.schedule import check_schedule


def check_config(config: ExperimentConfig, world_size: int = 1) -> None:
    """Raise ConfigError naming the key when the run cannot work as configured."""
    check_trainer(config, world_size)
    check_schedule(config.schedule, config.trainer.steps)
    try:
        config.data.check_inputs()
    except ValueError as error:
        raise ConfigError(str(error)) from None
