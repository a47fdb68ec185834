"""Train a Llama with a pluggable MLP activation. The main job.

    python train.py                                            # quickstart: CPU, minutes
    python train.py activation=swiglu trainer.steps=200
    torchrun --nproc_per_node=4 train.py experiment=paper_1b activation=xielu \\
        data.paths='[/scratch/fineweb-edu/sample/100BT/*.parquet]'

Configuration lives in configs/ (Hydra groups) with training/config.py as the schema.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from training.config import ConfigError, ExperimentConfig, register_configs, to_experiment
from training.loop import train

register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config: ExperimentConfig = to_experiment(cfg)
    except ValueError as error:  # a dataclass __post_init__ check, naming the key
        sys.exit(f"invalid configuration: {error}")
    try:
        code = train(config, OmegaConf.to_yaml(cfg, resolve=True))
    except ConfigError as error:  # settings that depend on each other, or on the run directory
        sys.exit(f"invalid configuration: {error}")
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
