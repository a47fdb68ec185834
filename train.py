"""Train a Llama with a pluggable MLP activation. The main job.

    python train.py                                            # quickstart: CPU, minutes
    python train.py activation=swiglu trainer.steps=200
    torchrun --nproc_per_node=4 train.py experiment=paper_1b activation=xielu \\
        data.paths='[/scratch/fineweb-edu/sample/100BT/*.parquet]'

Configuration lives in configs/ (Hydra groups) with training/config.py as the schema.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from data import DataError
from eval.downstream import InTraining
from training.config import ExperimentConfig, register_configs, to_experiment
from training.errors import ConfigError, IncompatibleCheckpointError, NoLoadableCheckpointError
from training.loop import train
from training.plugins import plugin_components
from training.renamed_keys import refuse_renamed

register_configs()

# How long a failed run's process may take to exit once the error has left ``train``.
FAILED_EXIT_DEADLINE_S = 120


def end_failed_run_within(seconds: float) -> None:
    """After training raised, the process must still end, with a non-zero code.

    What remains after the error is the interpreter's own exit: Hydra prints the error and
    calls ``sys.exit(1)``, then the atexit hooks run, among them multiprocessing's, which joins
    every child process with no timeout. One child that did not end (a DataLoader worker, which
    ignores SIGTERM; ``data.loader._kill_workers_left_at_exit`` says why it was left alive)
    kept failed 2-rank runs idle for over ten minutes, each rank's error already printed, until
    the job was killed. Whatever else may hang there next time (a child stuck in I/O, a
    library's exit hook), faulthandler's watchdog thread, which needs no GIL, prints every
    thread's stack (the evidence) and ends the process with exit code 1.
    """
    # no usable stderr (an embedding that replaced it): no deadline, the error still propagates
    with contextlib.suppress(AttributeError, OSError, RuntimeError, ValueError):
        faulthandler.dump_traceback_later(seconds, exit=True)


@hydra.main(version_base=None, config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config: ExperimentConfig = to_experiment(cfg)
    except ValueError as error:  # a dataclass __post_init__ check, naming the key
        sys.exit(f"invalid configuration: {error}")
    try:
        # from the packages above training: the downstream evaluator; from XIELU_PLUGINS:
        # components added to this run (training/plugins.py)
        code = train(
            config,
            OmegaConf.to_yaml(cfg, resolve=True),
            downstream=InTraining(),
            components=plugin_components(config),
        )
    except ConfigError as error:  # settings that depend on each other, or on the run directory
        sys.exit(f"invalid configuration: {error}")
    except (IncompatibleCheckpointError, NoLoadableCheckpointError) as error:  # nothing changed
        sys.exit(f"cannot resume: {error}")
    except DataError as error:  # found on the first batch, drawn before anything is written
        sys.exit(f"cannot train on this data: {error}")
    except BaseException:
        end_failed_run_within(FAILED_EXIT_DEADLINE_S)
        raise
    if code:
        sys.exit(code)


if __name__ == "__main__":
    try:  # before Hydra, which would stop at an old key with "not in struct"
        refuse_renamed(sys.argv[1:])
    except ConfigError as error:
        sys.exit(f"invalid configuration: {error}")
    main()
