"""What the trainer measures besides the training loss: three components on their cadences.

Validation loss on the held-out slice, the activation's per-layer regime
(``training.instruments.diagnostics``) and downstream tasks. Each runs on every rank (each is a
collective under DDP and FSDP2) and rank 0 logs its record. They share one
:class:`Measurements`, which tokenizes and packs the held-out slice once. A stop signal leaves
them pending (``AtStop.LATER``): the resumed run measures the restored weights first.

The downstream evaluator is handed in (``train.py`` passes ``eval.downstream.during_training``):
evaluation sits above training (it loads checkpoints and runs models through training's
runtime), so training never imports it and the packages' imports only run downward.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data import build_validation_loader
from training.checkpoint.rng import preserved_rng
from training.components import Component
from training.config import ExperimentConfig
from training.instruments.diagnostics import diagnostic_scalars, mlp_diagnostics
from training.instruments.validation import validation_loss
from training.runtime.distributed import Env

log = logging.getLogger(__name__)

# (model, tokenizer, tasks, limit, data_dir, task_dir, env, add_bos, batch_size) -> the
# ``downstream/<task>/<metric>`` record on rank 0, None elsewhere: eval.downstream.during_training
DownstreamEvaluator = Callable[..., "dict[str, float] | None"]


class Measurements:
    def __init__(
        self,
        config: ExperimentConfig,
        env: Env,
        model,
        tokenizer,
        run_dir: Path,
        downstream: DownstreamEvaluator | None = None,
    ):
        self.config, self.env, self.model, self.tokenizer = config, env, model, tokenizer
        self.run_dir = run_dir
        self.evaluate_downstream = downstream
        self.batches: list[dict] | None = None
        self.shape = (config.trainer.micro_batch, config.data.seq_len)

    def held_out(self) -> list[dict]:
        """This rank's validation batches: tokenized and packed once, reused every time."""
        if self.batches is None:
            t, env = self.config.trainer, self.env
            loader = build_validation_loader(
                self.config.data, t.micro_batch, env.rank, env.world_size
            )
            self.batches = list(itertools.islice(loader, t.eval_batches or None))
        return self.batches

    def validation(self) -> dict:
        """``val/loss``, ``val/perplexity`` and ``val/tokens`` (what the number covers:
        ``trainer.eval_batches`` > 0 is a part of the slice); empty for an empty slice."""
        model = self.model
        model.eval()
        result = validation_loss(
            model, self.held_out(), self.env.device, self.shape, model.autocast
        )
        model.train()
        if not result["tokens"]:
            return {}
        return {
            "val/loss": result["loss"],
            "val/perplexity": result["perplexity"],
            "val/tokens": result["tokens"],
        }

    def diagnostics(self) -> dict:
        """``diag/<statistic>/layer_NN`` on the first held-out batch."""
        batches = self.held_out()
        first = batches[0] if batches else None
        return diagnostic_scalars(mlp_diagnostics(self.model, first, self.env.device, self.shape))

    def downstream(self) -> dict:
        """``downstream/<task>/<metric>`` and ``downstream/seconds`` (rank 0; empty elsewhere)."""
        t = self.config.trainer
        started = time.perf_counter()
        # the training precision (a bf16 FSDP2 block's weights are gathered in bf16), and
        # the run's RNG untouched by lm-eval's reseeding
        with self.model.autocast(), preserved_rng():
            results = self.evaluate_downstream(
                self.model.bare,
                self.tokenizer,
                t.downstream_tasks,
                t.downstream_limit,
                t.downstream_data,
                self.run_dir / "downstream_tasks",
                self.env,
                self.config.data.tokenizer.add_bos,
                t.micro_batch,
            )
        self.model.train()
        if results is None:
            return {}
        return {**results, "downstream/seconds": time.perf_counter() - started}


class Diagnostics(Component):
    """The activation's regime, at initialisation too (step 0)."""

    name = "diagnostics"
    at = (0,)

    def __init__(self, measure: Measurements, every: int) -> None:
        self.measure, self.every = measure, every

    def step_end(self, trainer: Any) -> None:
        trainer.log(self.measure.diagnostics(), console=False)


class Validation(Component):
    """Also at the end of the stable phase (``stable_end``), whatever the cadence: the
    results tables compare runs there."""

    name = "validation"

    def __init__(self, measure: Measurements, every: int, stable_end: int | None) -> None:
        self.measure, self.every = measure, every
        self.at = () if stable_end is None else (stable_end,)

    def step_end(self, trainer: Any) -> None:
        record = self.measure.validation()
        if record:
            trainer.log(record)


class Downstream(Component):
    name = "downstream"

    def __init__(self, measure: Measurements, every: int) -> None:
        self.measure, self.every = measure, every

    def step_end(self, trainer: Any) -> None:
        record = self.measure.downstream()
        trainer.log(record, console=False)
        if trainer.env.is_main:
            shown = ", ".join(f"{k[len('downstream/') :]} {v:.3g}" for k, v in record.items())
            log.info("step %d downstream: %s", trainer.step, shown)
