"""The trainer's checkpoint component: when to save (its cadence, every stop), what goes in,
and the resume at the start; ``CheckpointWriter`` does the writing, ``load`` the reading.

Owning the cadence here, beside how many to keep and whether to write asynchronously, keeps
every decision about checkpoints in one place: ``checkpoint.every`` is read here and
nowhere else.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from data import needs_every_rank, restore_loader
from training.checkpoint.layout import CONFIG_FILE, CheckpointConfig
from training.checkpoint.load import load_latest, set_aside
from training.checkpoint.runs import checkpoint_config
from training.checkpoint.writer import CheckpointWriter
from training.components import AtStop, Component, Context
from training.errors import ConfigError, NonFiniteTrainingError
from training.resume_rules import refuse_fixed_changes
from training.runtime import distributed
from training.runtime.distributed import Env

if TYPE_CHECKING:  # the package is imported while training.config is (its sections)
    from training.config import ExperimentConfig

log = logging.getLogger(__name__)


class Checkpointing(Component):
    """Every ``checkpoint.every`` steps, at the last step, and at every stop, where it
    is on disk and published before the job goes away."""

    name = "checkpoint"
    at_stop = AtStop.ALWAYS
    at_last_even_when_off = True  # checkpoint.every=0: the finished run's checkpoint only

    def __init__(self, settings: CheckpointConfig, run_dir: Path, env: Env) -> None:
        self.every, self.env, self.run_dir = settings.every, env, Path(run_dir)
        self.writer = CheckpointWriter(
            self.run_dir, env, settings.keep, asynchronous=settings.async_write
        )

    @classmethod
    def from_context(cls, context: Context) -> Checkpointing:
        return cls(context.config.checkpoint, context.run_dir, context.env)

    def restore(self, trainer: Any) -> None:
        """The newest checkpoint whose bytes are intact, if this run may resume it; damaged
        ones are set aside, an intact one that does not fit stops the run (``load``)."""
        found = load_latest(
            self.run_dir,
            trainer.model.wrapped,
            trainer.optimizer,
            self.env,
            needs_every_rank=functools.partial(needs_every_rank, trainer.loader),
            accept=functools.partial(refuse_changes_since, trainer.config),
        )
        if found is None:
            return
        restore_loader(trainer.loader, found.data_states)  # as saved, or re-partitioned
        trainer.step = found.trainer_state["step"]
        # an older trainer.json may not record it: a function of the step (trainer.batch_ramp)
        trainer.tokens = found.trainer_state.get("tokens", trainer.plan.tokens_before(trainer.step))
        trainer.resumed_at = trainer.step
        trainer.state.load_state_dict(found.trainer_state)
        for damaged in found.damaged:
            set_aside(damaged, self.env)
        if self.env.is_main:
            log.info("resumed from %s at step %d", found.path, trainer.step)
            for change in found.changed_settings:
                log.warning("resumed with the config's optimizer setting: %s", change)

    def step_start(self, trainer: Any, step: int) -> None:
        self.writer.poll()  # publish the asynchronous save once every rank has written it

    def after_update(self, trainer: Any, step: int, stepped: bool) -> None:
        trainer.record["checkpoint_stall_s"] = self.writer.stall_s

    def step_end(self, trainer: Any, step: int) -> None:
        loss, grad_norm = trainer.record.get("loss", 0.0), trainer.record.get("grad_norm", 0.0)
        if step and not (math.isfinite(loss) and math.isfinite(grad_norm)):
            # its update was skipped, but what made it non-finite may be in the weights (a rate
            # that blew them up while they stay finite): the last good checkpoint stays newest.
            # The loss is summed over ranks and the norm global, so every rank agrees.
            if step == trainer.config.trainer.steps and not trainer.stopping:
                raise NonFiniteTrainingError(
                    f"step {step}, the run's last, has a non-finite loss ({loss}) or gradient "
                    f"norm ({grad_norm}): not checkpointed, so the run is not finished; its "
                    "newest good checkpoint is on disk"
                )
            if self.env.is_main:
                log.warning(
                    "step %d: not checkpointed: its loss (%s) or gradient norm (%s) is not finite",
                    step,
                    loss,
                    grad_norm,
                )
            return
        if distributed.any_rank(not trainer.model.local_weights_finite(), self.env.device):
            raise NonFiniteTrainingError(
                f"step {step}: the weights are not finite; refusing to overwrite good "
                "checkpoints with them"
            )
        self.writer.save(
            step,
            trainer.model.wrapped,
            trainer.optimizer,
            {"step": step, "tokens": trainer.tokens, **trainer.state.state_dict()},
            trainer.loader.state_dict(),
            trainer.config_yaml,
        )
        if trainer.stopping:
            self.writer.wait()

    def end(self, trainer: Any, error: BaseException | None) -> None:
        """A save in flight is finished, after a non-finite stop too: it holds finite weights."""
        if error is None or isinstance(error, NonFiniteTrainingError):
            self.writer.wait()


def refuse_changes_since(config: ExperimentConfig, path: Path) -> None:
    """Refuse a checkpoint whose run had other values for what a resume may not change
    (``training.resume_rules``), compared with the config it holds itself."""
    where = path / CONFIG_FILE
    if not where.is_file() or not where.stat().st_size:
        return  # nothing recorded to compare with
    try:
        saved = checkpoint_config(path)
    except Exception as error:
        raise ConfigError(f"{where} cannot be read to compare with ({error})") from error
    refuse_fixed_changes(saved, config, where)
