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
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from data import build_validation_loaders
from settings import Run, Section, at_least
from training.checkpoint.rng import preserved_rng
from training.components import Component, Context
from training.instruments.diagnostics import diagnostic_scalars, mlp_diagnostics
from training.instruments.validation import validation_loss
from training.runtime.distributed import Env
from training.schedule import stable_phase_end

log = logging.getLogger(__name__)

# (model, tokenizer, tasks, limit, data_dir, task_dir, env, add_bos, batch_size) -> the
# ``downstream/<task>/<metric>`` record on rank 0, None elsewhere: eval.downstream.during_training
DownstreamEvaluator = Callable[..., "dict[str, float] | None"]


@dataclass
class ValidationConfig(Section):
    """``validation``: the held-out loss (``val/loss``, per source of a mixture too).

    Attributes:
        every: steps between validation passes (and one at the end); 0 disables.
        batches: validation batches per pass and rank (of ``trainer.micro_batch`` sequences);
            0: the whole slice, the only setting whose numbers compare across world sizes.
    """

    every: int = 50
    batches: int = 4

    def check(self, run: Run | None = None) -> None:
        at_least("validation.every", self.every, 0)
        at_least("validation.batches", self.batches, 0)


@dataclass
class DownstreamConfig(Section):
    """``downstream``: lm-eval on the model being trained (``eval.downstream.InTraining``: every
    rank scores its share of the documents), logged as ``downstream/<task>/<metric>`` beside
    ``val/loss``, with the call's cost in ``downstream/seconds``.

    Attributes:
        every: steps between downstream evaluations, and at the end; 0 disables.
        tasks: lm-eval task names (the paper's multiple-choice tasks by default; with ``data``
            the local copies of the same names are used).
        limit: documents per task and evaluation (None: all).
        data: a directory of the benchmarks' published files, as ``python -m
            eval.fetch_benchmarks DIR`` writes them, to build lm-eval tasks from offline
            (``eval.local_tasks``); empty: lm-eval's own tasks, which download their data from
            the Hugging Face Hub. Checked at start-up by the evaluator itself.
    """

    every: int = 0
    tasks: list[str] = field(
        default_factory=lambda: ["piqa", "arc_easy", "arc_challenge", "hellaswag", "winogrande"]
    )
    limit: int | None = 200
    data: str = ""

    def check(self, run: Run | None = None) -> None:
        at_least("downstream.every", self.every, 0)


class Measurements:
    def __init__(
        self,
        config: Any,
        env: Env,
        model,
        tokenizer,
        run_dir: Path,
        downstream: DownstreamEvaluator | None = None,
    ):
        self.config, self.env, self.model, self.tokenizer = config, env, model, tokenizer
        self.run_dir = run_dir
        self.evaluate_downstream = downstream
        self.parts: dict[str, list[dict]] | None = None
        self.shape = (config.trainer.micro_batch, config.data.seq_len)

    def held_out_parts(self) -> dict[str, list[dict]]:
        """This rank's validation batches of each source of a mixture (``{"": batches}`` for
        one source): tokenized and packed once, reused every time."""
        if self.parts is None:
            t, env, data = self.config.trainer, self.env, self.config.data
            self.parts = {}
            loaders = build_validation_loaders(data, t.micro_batch, env.rank, env.world_size)
            batches = self.config.validation.batches or None
            for name, loader in loaders.items():
                self.parts[name] = list(itertools.islice(loader, batches))
        return self.parts

    def held_out(self) -> list[dict]:
        """Every source's validation batches, one source after the other."""
        return [batch for batches in self.held_out_parts().values() for batch in batches]

    def validation(self) -> dict:
        """``val/loss``, ``val/perplexity`` and ``val/tokens`` (what the number covers:
        ``validation.batches`` > 0 is a part of the slice); empty for an empty slice. A
        mixture adds ``val/loss/<name>`` and ``val/tokens/<name>`` for each source; its
        ``val/loss`` is over all the sources' held-out tokens together."""
        model = self.model
        model.eval()
        results = {
            name: validation_loss(model, batches, self.env.device, self.shape, model.autocast)
            for name, batches in self.held_out_parts().items()
        }
        model.train()
        tokens = sum(result["tokens"] for result in results.values())
        if not tokens:
            return {}
        if len(results) == 1:
            loss = next(iter(results.values()))["loss"]
        else:
            loss = sum(r["loss"] * r["tokens"] for r in results.values() if r["tokens"]) / tokens
        record = {"val/loss": loss, "val/perplexity": math.exp(min(loss, 50)), "val/tokens": tokens}
        for name, result in results.items():
            if name and result["tokens"]:
                record[f"val/loss/{name}"] = result["loss"]
                record[f"val/tokens/{name}"] = result["tokens"]
        return record

    def diagnostics(self) -> dict:
        """``diag/<statistic>/layer_NN`` on the first held-out batch."""
        batches = self.held_out()
        first = batches[0] if batches else None
        return diagnostic_scalars(mlp_diagnostics(self.model, first, self.env.device, self.shape))

    def downstream(self) -> dict:
        """``downstream/<task>/<metric>`` and ``downstream/seconds`` (rank 0; empty elsewhere)."""
        d = self.config.downstream
        started = time.perf_counter()
        # the training precision (a bf16 FSDP2 block's weights are gathered in bf16), the
        # run's RNG untouched by lm-eval's reseeding, and compiled blocks run eagerly: the
        # requests come in many lengths and batch sizes, each a recompilation otherwise
        # (8.8 s of Dynamo per run of the end-to-end tier's 2-block FSDP2 preset on a CPU,
        # and Inductor would generate kernels for every new shape)
        with self.model.autocast(), preserved_rng(), torch.compiler.set_stance("force_eager"):
            results = self.evaluate_downstream(
                self.model.bare,
                self.tokenizer,
                d.tasks,
                d.limit,
                d.data,
                self.run_dir / "downstream_tasks",
                self.env,
                self.config.data.tokenizer.add_bos,
                self.config.trainer.micro_batch,
            )
        self.model.train()
        if results is None:
            return {}
        return {**results, "downstream/seconds": time.perf_counter() - started}


class Diagnostics(Component):
    """The activation's regime, at initialisation too (step 0)."""

    name = "diagnostics"

    def __init__(self, measure: Measurements, every: int) -> None:
        self.measure, self.every = measure, every
        self.at = (0,) if every else ()

    @classmethod
    def from_context(cls, context: Context) -> Diagnostics:
        return cls(context.measure, context.config.logging.diagnostics_every)

    def step_end(self, trainer: Any, step: int) -> None:
        record = self.measure.diagnostics()
        if record:  # empty without a held-out slice
            trainer.log(record, console=False, step=step)


class Validation(Component):
    """Also at the end of the stable phase (``stable_end``), whatever the cadence: the
    results tables compare runs there."""

    name = "validation"

    def __init__(self, measure: Measurements, every: int, stable_end: int | None) -> None:
        self.measure, self.every = measure, every
        self.at = () if stable_end is None or not every else (stable_end,)

    @classmethod
    def from_context(cls, context: Context) -> Validation:
        c = context.config
        # where the stable phase ends, in steps (later under a batch ramp, read in tokens)
        stable_end = context.batches.step_at(stable_phase_end(c.schedule, c.trainer.steps))
        return cls(context.measure, c.validation.every, stable_end)

    def step_end(self, trainer: Any, step: int) -> None:
        record = self.measure.validation()
        if record:
            trainer.log(record, step=step)


class Downstream(Component):
    name = "downstream"

    def __init__(self, measure: Measurements, every: int) -> None:
        self.measure, self.every = measure, every

    @classmethod
    def from_context(cls, context: Context) -> Downstream:
        return cls(context.measure, context.config.downstream.every)

    def step_end(self, trainer: Any, step: int) -> None:
        record = self.measure.downstream()
        trainer.log(record, console=False, step=step)
        if trainer.env.is_main:
            shown = ", ".join(f"{k[len('downstream/') :]} {v:.3g}" for k, v in record.items())
            log.info("step %d downstream: %s", step, shown)
