"""The training loop: take a step, run the components' hooks; repeat until done or stopped.

One optimizer step = ``accumulation`` micro-batches per rank; the loss of a step is the mean
over its global batch, the same number whatever the world size (see ``tests/test_train_*``).
Everything else the trainer does (the step verdicts, logging, measurements, profiling,
checkpoints) is a component with its own cadence and state (``training.components``).
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from data import DataError, build_loader, first_batch, load_tokenizer
from model import Llama
from training.axes import write_run_files
from training.batch_ramp import BatchPlan
from training.checkpoint import Checkpointing, remove_crashed_saves
from training.checks import (
    check_against_tokenizer,
    check_config,
    check_on_device,
    unread_settings,
)
from training.components import Component, Components, Context, TrainerState, keeps_state
from training.config import ExperimentConfig
from training.errors import CheckpointWriteError, NonFiniteTrainingError
from training.initial_weights import check_tokenizer, load_initial_weights
from training.instruments.measurements import DownstreamEvaluator, Measurements
from training.instruments.metrics import MetricsLogger
from training.loss_mask import LossMask
from training.optim import build_optimizer
from training.parameter_groups import set_learning_rate
from training.runtime import distributed
from training.runtime.parallelize import compile_backend, parallelize
from training.runtime.preemption import Preemption
from training.schedule import learning_rate
from training.shipped import SHIPPED
from training.step import train_step
from training.summary import closing_summary, opening_line

log = logging.getLogger(__name__)

EXIT_NON_FINITE = 3
EXIT_CHECKPOINT_FAILED = 4


def build_model(config: ExperimentConfig, vocab_size: int, device: torch.device) -> Llama:
    """The bare model, seeded, on ``device``; ``training.runtime.parallelize`` makes it
    trainable."""
    check_on_device(config, device)
    torch.manual_seed(config.trainer.seed)
    return Llama(config.model.with_vocab_from_tokenizer(vocab_size)).to(device)


class Trainer:
    def __init__(
        self,
        config: ExperimentConfig,
        config_yaml: str,
        downstream: DownstreamEvaluator | None = None,
        components: Sequence[Component] = (),
    ) -> None:
        """``downstream``: what evaluates ``downstream.tasks`` (``train.py`` passes
        ``eval.downstream.during_training``; training does not import eval). ``components``:
        added from outside (docs/extending.md), run after the shipped ones, before the
        checkpoint."""
        self.config, self.config_yaml = config, config_yaml
        self.env = env = distributed.init(config.parallel.collective_timeout_s)
        check_config(config, env.world_size, downstream)
        t = config.trainer
        self.run_dir = Path(t.run_dir)
        self.plan = BatchPlan(config, env.world_size)  # each step's batch (trainer.batch_ramp)
        self.global_batch, self.accumulation = self.plan.at(0)
        self.tokenizer = load_tokenizer(config.data.tokenizer)
        check_against_tokenizer(config, self.tokenizer)
        initial_hf = config.checkpoint.initial_hf
        check_tokenizer(initial_hf, config.data.tokenizer.path, self.tokenizer.vocab_size)
        self.loss_mask = LossMask.from_config(config.loss, self.tokenizer.eos_id)
        model = build_model(config, self.tokenizer.vocab_size, env.device)
        load_initial_weights(model, initial_hf, self.run_dir, env.is_main)  # before wrapping
        self.model_config = model.config
        self.model = parallelize(model, env, config.parallel)
        self.optimizer = build_optimizer(self.model.bare, config.optim, env.device)
        self.loader = build_loader(config.data, t.micro_batch, env.rank, env.world_size)
        self.measure = Measurements(
            config, env, self.model, self.tokenizer, self.run_dir, downstream
        )
        self.step, self.tokens = 0, 0
        self.resumed_at: int | None = None  # the checkpoint's step, when the start resumed one
        self.record: dict = {}  # the step's values: the loss, lr and norm, what components add
        self.stopping = False  # a stop signal reached every rank at this step
        context = Context(
            config, env, self.model, self.model_config, self.run_dir, self.plan, self.measure
        )
        self.checkpointing = Checkpointing.from_context(context)
        shipped = [c for c in (cls.from_context(context) for cls in SHIPPED) if c is not None]
        self.components = Components([*shipped, *components, self.checkpointing], t.steps)
        # every part whose state changes the run's future: saved and restored together
        self.state = TrainerState()
        self.state.register("work", self.components)
        for component in filter(keeps_state, [*shipped, *components]):
            self.state.register(component.name, component, required=component in shipped)
        self.preemption = Preemption()
        self.logger: MetricsLogger | None = None

    def run(self) -> int:
        # every check that can refuse this start against the run directory (the newest
        # checkpoint's config and bytes, the load itself) runs before the first byte is written
        self.checkpointing.restore(self)
        data = self._first_batch_or_refuse()
        self._open_run_directory()
        self.preemption.install()
        error, exit_code = None, 0
        try:
            self.components.begin(self)
            self.components.run_pending(self, self.step)  # what a stop left, on these weights
            if self.step == 0:  # the regime at initialisation
                self.components.step_end(self, 0, stopping=False)
            while self.step < self.config.trainer.steps:
                self.components.step_start(self, self.step + 1)
                self._train_step(data)
                wish = self.preemption.agreed_wish(self.env)
                self.stopping = wish > 0
                self.components.step_end(self, self.step, self.stopping)  # a stop: checkpointed
                if self.stopping:
                    exit_code = self.preemption.stopped(wish, self.step, self.env.is_main)
                    break
        except BaseException as raised:
            error = raised
            raise
        finally:
            try:
                self.components.end(self, error)  # e.g. the last save published, or failing
            finally:
                self.preemption.uninstall()
                if self.logger is not None:
                    self.logger.close()
        if not self.stopping:
            closing_summary(self)
        return exit_code

    def _first_batch_or_refuse(self):
        """The training batches, their first drawn now, before anything is written: data that
        cannot feed a step (an empty file, every document held out, no record with text, files
        changed since the checkpoint) is refused like a bad setting. Every rank agrees first,
        so that none waits for the others in a collective while one is refusing. Nothing saves
        between this draw and the first step, so no checkpoint records the drawn batch twice."""
        data, refusal = first_batch(self.loader)
        refused = distributed.all_reduce_sum([float(refusal is not None)], self.env.device)[0]
        if refusal is not None:
            raise refusal
        if refused:
            raise DataError("another rank's data cannot feed a step: its message says why")
        return data

    def _train_step(self, data) -> None:
        """One update (or a step a component's verdict skips); ``self.record`` holds its
        values for the components that read them after the update."""
        c, env, step = self.config, self.env, self.step + 1  # the step being taken, 1-based
        self.global_batch, self.accumulation = self.plan.at(self.step)
        lr = learning_rate(self.plan.position(self.step), c.trainer.steps, c.optim, c.schedule)
        set_learning_rate(self.optimizer, lr)

        def decide(loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> bool:
            """The loss summed over ranks, so that every rank reaches the same verdict."""
            total = distributed.all_reduce_sum([loss_sum.item()], env.device)[0]
            loss = total / (self.accumulation * env.world_size)
            self.record = {"loss": loss, "lr": lr, "grad_norm": float(grad_norm)}
            if c.optim.matrix_rate:  # the matrices' own rate (muon_lr): the schedule's, scaled
                self.record[f"{c.optim.name}_lr"] = lr * c.optim.matrix_rate[1] / c.optim.lr
            return self.components.before_update(self, step, loss, self.record["grad_norm"])

        try:
            result = train_step(
                self.model,
                self.optimizer,
                data,
                self.accumulation,
                c.optim.grad_clip,
                should_update=decide,
                before_clip=functools.partial(self.components.before_clip, self, step),
                loss_mask=self.loss_mask,
                z_loss=c.loss.z_loss,
            )
        except torch.OutOfMemoryError:
            self.components.out_of_memory(self)
            raise
        self.record.update(result.measured)
        self.step = step
        self.tokens += self.global_batch * c.data.seq_len
        self.components.after_update(self, step, result.stepped)

    def log(self, record: dict, console: bool = True, step: int | None = None) -> None:
        """Log a component's record at ``step`` (default: the step just taken); rank 0."""
        if self.env.is_main:
            self.logger.log(self.step if step is None else step, record, console=console)

    def _open_run_directory(self) -> None:
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_run_files(self.run_dir, self.config, self.config_yaml)
        distributed.barrier()
        remove_crashed_saves(self.run_dir, self.env)
        if self.env.is_main:
            config = asdict(replace(self.config, model=self.model_config))
            wandb, name = self.config.logging.wandb, self.config.name
            self.logger = MetricsLogger(self.run_dir, wandb, config, name, self.resumed_at)
            log.info(opening_line(self))
            for warning in [*self.plan.warnings(), *unread_settings(self.config)]:
                log.warning("%s", warning)

    def release_model(self) -> None:
        """Drop the model and optimizer while the process group still exists: DDP's reducer,
        which holds the gloo group, freed after ``destroy_process_group`` would run the group's
        destructor holding the GIL, joining a thread that waits for it (a hang at exit, seen
        twice on 2 cores)."""
        self.model = self.optimizer = self.measure = None
        self.components = self.state = None  # the measurements hold the model too
        gc.collect()


def train(
    config: ExperimentConfig,
    config_yaml: str,
    downstream: DownstreamEvaluator | None = None,
    components: Sequence[Component] = (),
) -> int:
    """Run training; returns the process exit code."""
    with compile_backend(config.parallel.compile_backend):
        trainer = Trainer(config, config_yaml, downstream, components)
        try:
            return trainer.run()
        except NonFiniteTrainingError as error:
            log.error("%s", error)
            return EXIT_NON_FINITE
        except CheckpointWriteError as error:
            log.error("%s", error)
            return EXIT_CHECKPOINT_FAILED
        finally:
            trainer.release_model()
            distributed.shutdown()
