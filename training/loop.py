"""The training loop: composes model, data, optimizer, schedule, checkpoints and logging.

One optimizer step = ``accumulation`` micro-batches per rank; the loss of a step is the mean
over its global batch, the same number whatever the world size (see ``tests/test_train_*``).
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from data import build_loader, load_tokenizer, needs_every_rank, restore_loader
from data import counters as data_counters
from model import Llama, count_parameters, training_flops_per_token
from training import checkpoint
from training.axes import write_run_files
from training.checkpoint import CheckpointWriteError, CheckpointWriter
from training.checks import check_against_tokenizer, check_config
from training.components import Instrument, Periodic, PeriodicWork, TrainerState
from training.config import ConfigError, ExperimentConfig
from training.instruments.grad_norms import per_layer_grad_norms
from training.instruments.measurements import DownstreamEvaluator, Measurements
from training.instruments.metrics import (
    MetricsLogger,
    alpha_scalars,
    device_peak_flops,
    peak_memory_gib,
)
from training.instruments.profiling import StepProfiler
from training.instruments.spikes import SpikeMonitor
from training.optim import build_optimizer, set_learning_rate
from training.resume_rules import refuse_fixed_changes
from training.runtime import distributed
from training.runtime.parallelize import parallelize, plan_from_config
from training.runtime.preemption import (
    EXIT_PREEMPTED,
    REQUEUE,
    Preemption,
    parse_debug_signal,
    requeue_or_exit_code,
)
from training.schedule import learning_rate, stable_phase_end
from training.step import train_step
from training.step_health import NonFiniteTrainingError, StepHealth
from training.summary import run_summary, validation_entropy

log = logging.getLogger(__name__)

EXIT_NON_FINITE = 3
EXIT_CHECKPOINT_FAILED = 4


def build_model(config: ExperimentConfig, vocab_size: int, device: torch.device) -> Llama:
    """The bare model, seeded, on ``device``; ``training.runtime.parallelize`` makes it
    trainable."""
    torch.manual_seed(config.trainer.seed)
    return Llama(config.model.with_vocab_from_tokenizer(vocab_size)).to(device)


class Trainer:
    def __init__(
        self,
        config: ExperimentConfig,
        config_yaml: str,
        downstream: DownstreamEvaluator | None = None,
        instruments: Sequence[Instrument] = (),
    ) -> None:
        """``downstream``: what evaluates ``trainer.downstream_tasks`` (``train.py`` passes
        ``eval.downstream.during_training``; training does not import eval). ``instruments``:
        measurements added from outside (``training.components.Instrument``)."""
        self.config, self.config_yaml = config, config_yaml
        if config.trainer.downstream_every and downstream is None:
            raise ConfigError(
                f"trainer.downstream_every={config.trainer.downstream_every} needs a downstream "
                "evaluator: train.py passes eval.downstream.during_training; from Python, "
                "training.loop.train(config, config_yaml, downstream=during_training)"
            )
        self.env = distributed.init(config.trainer.collective_timeout_s)
        check_config(config, self.env.world_size)
        t = config.trainer
        self.run_dir = Path(t.run_dir)
        self.global_batch = config.sequences_per_step
        self.accumulation = self.global_batch // (t.micro_batch * self.env.world_size)
        self.tokenizer = load_tokenizer(config.data.tokenizer)
        check_against_tokenizer(config, self.tokenizer)
        model = build_model(config, self.tokenizer.vocab_size, self.env.device)
        self.model_config = model.config
        model.z_loss = config.optim.z_loss  # in training only: Llama drops it in eval()
        self.model = parallelize(model, self.env, plan_from_config(t, self.env.device))
        self.optimizer = build_optimizer(self.model.bare, config.optim, self.env.device)
        self.loader = build_loader(config.data, t.micro_batch, self.env.rank, self.env.world_size)
        self.measure = Measurements(
            config, self.env, self.model, self.tokenizer, self.run_dir, downstream
        )
        self.step, self.tokens = 0, 0
        self.resumed_at: int | None = None  # the checkpoint's step, when the start resumed one
        spikes = SpikeMonitor(t.spike_window, t.spike_threshold) if t.spike_window else None
        self.health = StepHealth(t.max_bad_steps, spikes, t.spike_skip, t.spike_skip_limit)
        self.profiler = StepProfiler(t.profile_steps, t.run_dir, self.env.rank, self.env.device)
        s = config.schedule  # validated at the end of the stable phase, whatever eval_every is
        stable_end = () if (end := stable_phase_end(s, t.steps)) is None else (end,)
        # the measurements, in the order they run at a step; each is logged at each of its
        # steps exactly once, even when a stop signal interrupts that step (components.py)
        self.work = PeriodicWork(
            [
                Periodic(
                    "diagnostics", config.logging.diagnostics_every, self._diagnose, (0, t.steps)
                ),
                Periodic("validation", t.eval_every, self._evaluate, (*stable_end, t.steps)),
                Periodic("downstream", t.downstream_every, self._downstream, (t.steps,)),
                *(
                    Periodic(i.name, i.every, functools.partial(self._instrument, i), (t.steps,))
                    for i in instruments
                ),
            ]
        )
        # every part whose state changes the run's future: saved and restored together
        self.state = TrainerState()
        self.state.register("health", self.health)
        self.state.register("work", self.work)
        for instrument in instruments:
            if hasattr(instrument, "state_dict"):
                self.state.register(instrument.name, instrument, required=False)
        self.preemption = Preemption()
        self.injected_signal = parse_debug_signal(t.debug_signal)  # (signal, step, rank) or None
        self.writer = CheckpointWriter(
            self.run_dir, self.env, t.keep_checkpoints, asynchronous=t.async_checkpoint
        )
        self.logger: MetricsLogger | None = None
        self.flops_per_token = training_flops_per_token(self.model_config, config.data.seq_len)
        self.peak = device_peak_flops(self.env.device)

    # ----------------------------------------------------------------------------------------
    def run(self) -> int:
        env, t = self.env, self.config.trainer
        # every check that can refuse this start against the run directory (the newest
        # checkpoint's config and bytes, the load itself) runs before the first byte is written
        self._resume()
        if env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_run_files(self.run_dir, self.config, self.config_yaml)
        distributed.barrier()
        checkpoint.remove_crashed_saves(self.run_dir, env)
        if env.is_main:
            self.logger = MetricsLogger(
                self.run_dir,
                self.config.logging.wandb,
                self._config_dict(),
                self.config.name,
                resumed_at=self.resumed_at,
            )
            self._announce()
        self.preemption.install()
        data = iter(self.loader)
        self.work.run_pending()  # what a stop signal interrupted, on the restored weights
        if self.step == 0:
            self.work.at_step(0, interrupted=False)  # the regime at initialisation
        exit_code = 0
        started, start_step = time.perf_counter(), self.step
        try:
            while self.step < t.steps:
                step_start = time.perf_counter()
                self.profiler.before(self.step + 1)
                try:
                    metrics = self._train_step(data)
                except torch.OutOfMemoryError:
                    self.profiler.out_of_memory()
                    raise
                self.profiler.after(self.step)
                step_time = time.perf_counter() - step_start
                if self._should(t.log_every) or self.step == t.steps:
                    elapsed = time.perf_counter() - started
                    rate = (self.step - start_step) / max(elapsed, 1e-9)
                    self._log(metrics, step_time, (t.steps - self.step) / max(rate, 1e-9))
                self._debug_signal()
                # a stop signal goes straight to the checkpoint: the grace period is short
                wish = self.preemption.agreed_wish(env.device)
                preempted = wish > 0
                if preempted and env.is_main:
                    log.warning(
                        "signal %s received", self.preemption.requested or "on another rank"
                    )
                self.work.at_step(self.step, interrupted=preempted)
                if self._should(t.checkpoint_every) or self.step == t.steps or preempted:
                    self._save()
                if preempted:
                    self.writer.wait()  # on disk and published before the job goes away
                    self.preemption.checkpointed = True
                    exit_code = EXIT_PREEMPTED
                    if wish == REQUEUE and env.is_main:
                        log.warning("stopping at step %d; requeueing the job", self.step)
                        exit_code = requeue_or_exit_code()
                    elif env.is_main:
                        log.warning(
                            "stopping at step %d, checkpointed, not requeued (SIGTERM: scancel "
                            "or the scheduler, which requeues by itself if it preempted); rerun "
                            "the same command to resume",
                            self.step,
                        )
                    break
                self.writer.poll()
            self.writer.wait()
        except NonFiniteTrainingError:
            self.writer.wait()  # the save in flight holds finite weights: keep it
            raise
        finally:
            self.preemption.uninstall()
            if self.logger is not None:
                self.logger.close()
        if exit_code == 0 and self.step == t.steps:
            entropy = validation_entropy(self.measure.batches, self.model_config, env.device)
            if env.is_main:
                summary = run_summary(
                    self.model.bare,
                    self.tokenizer,
                    self.measure.batches,
                    self.run_dir,
                    self.config,
                    entropy=entropy,
                )
                print("\n".join(summary), flush=True)  # the user's closing screen, not a log
        return exit_code

    # ----------------------------------------------------------------------------------------
    def _train_step(self, data) -> dict:
        t, env = self.config.trainer, self.env
        lr = learning_rate(self.step, t.steps, self.config.optim, self.config.schedule)
        set_learning_rate(self.optimizer, lr)
        every_grad = self.config.logging.grad_norms_every
        seen = {}

        def decide(loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> bool:
            """The loss summed over ranks, so that every rank reaches the same verdict."""
            total = distributed.all_reduce_sum([loss_sum.item()], env.device)[0]
            seen["loss"] = total / (self.accumulation * env.world_size)
            seen["grad_norm"] = float(grad_norm)
            return self.health.should_update(seen["loss"], seen["grad_norm"])

        result = train_step(
            self.model,
            self.optimizer,
            data,
            self.accumulation,
            self.config.optim.grad_clip,
            should_update=decide,
            poison_loss=self.step in t.debug_nan_steps,  # fault injection for tests
            before_clip=self._read_grad_norms if self._should_at_next(every_grad) else None,
        )
        loss_value, grad_norm = seen["loss"], seen["grad_norm"]
        self.health.settle(self.step + 1, result.stepped, loss_value, grad_norm, env.is_main)
        self.step += 1
        self.tokens += self.global_batch * self.config.data.seq_len
        metrics = {"loss": loss_value, "lr": lr, "grad_norm": grad_norm}
        if self.health.spike_count is not None:
            metrics["spikes"] = self.health.spike_count
        return metrics

    # ----------------------------------------------------------------------------------------
    def _evaluate(self) -> None:
        record = self.measure.validation()
        if self.env.is_main and record:
            self.logger.log(self.step, record)

    def _downstream(self) -> None:
        record = self.measure.downstream()
        if self.env.is_main:
            self.logger.log(self.step, record, console=False)
            shown = ", ".join(f"{k[len('downstream/') :]} {v:.3g}" for k, v in record.items())
            log.info("step %d downstream: %s", self.step, shown)

    def _instrument(self, instrument: Instrument) -> None:
        record = instrument.measure(self)
        if self.env.is_main and record:
            self.logger.log(self.step, record, console=False)

    def _diagnose(self) -> None:
        record = self.measure.diagnostics()
        if self.env.is_main:
            self.logger.log(self.step, record, console=False)

    def _log(self, metrics: dict, step_time: float, eta: float) -> None:
        per_layer = self.model.activation_scalars()  # a collective under FSDP: every rank
        data_counts = data_counters(self.loader.state_dict())  # this rank's streams
        summed = distributed.all_reduce_sum(list(data_counts.values()), self.env.device)
        if not self.env.is_main:
            return
        tokens_per_s = self.global_batch * self.config.data.seq_len / step_time
        per_device = tokens_per_s / self.env.world_size
        record = {
            **metrics,
            "perplexity": math.exp(min(metrics["loss"], 50)),
            "tokens": self.tokens,
            "tokens_per_s": tokens_per_s,
            "step_time_s": step_time,
            "skipped_steps": self.health.skipped,
            "memory_gib": peak_memory_gib(self.env.device),
            "checkpoint_stall_s": self.writer.stall_s,
            "eta_s": eta,
            **alpha_scalars(per_layer),
            **{f"data/{name}": int(n) for name, n in zip(data_counts, summed, strict=True)},
        }
        if self.peak:
            record["mfu"] = per_device * self.flops_per_token / self.peak
        self.logger.log(self.step, record)
        self.logger.log_alpha_table(self.step, per_layer)

    def _debug_signal(self) -> None:
        if self.injected_signal is None:
            return
        sig, step, rank = self.injected_signal
        if self.step == step and rank in (None, self.env.rank):
            os.kill(os.getpid(), sig)

    def _should(self, every: int) -> bool:
        return every > 0 and self.step % every == 0

    def _should_at_next(self, every: int) -> bool:
        """Whether the step about to be taken (it becomes ``self.step + 1``) is an ``every``."""
        return every > 0 and (self.step + 1) % every == 0

    def _read_grad_norms(self) -> None:
        norms = per_layer_grad_norms(self.model, self.env.device)  # a collective under FSDP2
        if self.env.is_main:
            self.logger.log(self.step + 1, norms, console=False)

    # ----------------------------------------------------------------------------------------
    def _trainer_state(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, **self.state.state_dict()}

    def _save(self) -> None:
        t = self.config.trainer
        if distributed.any_rank(not self.model.local_weights_finite(), self.env.device):
            raise NonFiniteTrainingError(
                f"step {self.step}: the weights are not finite; refusing to overwrite good "
                "checkpoints with them"
            )
        self.writer.save(
            self.step,
            self.model.wrapped,
            self.optimizer,
            self._trainer_state(),
            self.loader.state_dict(),
            self.config_yaml,
            crash_before_publish=self.step == t.debug_crash_in_checkpoint_at,
        )

    def _resume(self) -> None:
        """The newest checkpoint whose bytes are intact, if this run may resume it; a damaged
        one is set aside, an intact one that does not fit stops the run (checkpoint.load)."""
        found = checkpoint.load_latest(
            self.run_dir,
            self.model.wrapped,
            self.optimizer,
            self.env,
            needs_every_rank=functools.partial(needs_every_rank, self.loader),
            accept=self._may_resume,
        )
        if found is None:
            return
        restore_loader(self.loader, found.data_states)  # data decides: as saved, or re-partitioned
        self.step, self.tokens = found.trainer_state["step"], found.trainer_state["tokens"]
        self.resumed_at = self.step
        self.state.load_state_dict(found.trainer_state)
        for damaged in found.damaged:
            checkpoint.set_aside(damaged, self.env)
        if self.env.is_main:
            log.info("resumed from %s at step %d", found.path, self.step)
            for change in found.changed_settings:
                log.warning("resumed with the config's optimizer setting: %s", change)

    def _may_resume(self, path: Path) -> None:
        """Refuse a checkpoint whose run had other values for what a resume may not change
        (``training.resume_rules``), compared with the config it holds itself."""
        where = path / checkpoint.CONFIG_FILE
        if not where.is_file() or not where.stat().st_size:
            return  # nothing recorded to compare with
        try:
            saved = checkpoint.checkpoint_config(path)
        except Exception as error:
            raise ConfigError(f"{where} cannot be read to compare with ({error})") from error
        refuse_fixed_changes(saved, self.config, where)

    def release_model(self) -> None:
        """Drop the model and optimizer while the process group still exists.

        DDP's reducer holds the gloo process group, and it is freed holding the GIL. Freed
        after ``destroy_process_group``, it would own the group's last reference and run the
        group's destructor, which joins a worker thread that may be waiting for the GIL to free
        a tensor: the process hangs at exit (seen twice in two parallel test-suite runs on 2
        cores). Freed here, the group outlives it and ``destroy_process_group`` ends the group
        without the GIL.
        """
        self.model = self.optimizer = self.measure = None
        gc.collect()

    def _config_dict(self) -> dict:
        config = replace(self.config, model=self.model_config)
        return asdict(config)

    def _announce(self) -> None:
        params = count_parameters(self.model_config)
        c, env = self.config, self.env
        log.info(
            f"{c.name}: {c.model.activation}, {params.total / 1e6:.1f}M parameters "
            f"(vocab {self.model_config.vocab_size}), {env.world_size} x {env.device.type}, "
            f"{c.trainer.parallelism if env.distributed else 'single process'}, "
            f"global batch {self.global_batch} x {c.data.seq_len} tokens "
            f"(accumulation {self.accumulation}), {c.trainer.steps} steps -> {self.run_dir}"
        )


def train(
    config: ExperimentConfig,
    config_yaml: str,
    downstream: DownstreamEvaluator | None = None,
    instruments: Sequence[Instrument] = (),
) -> int:
    """Run training; returns the process exit code."""
    trainer = Trainer(config, config_yaml, downstream, instruments)
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
