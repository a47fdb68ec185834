"""docs/extending.md, followed literally: a toy activation, data source, schedule, optimizer,
tokenizer and instrument, each defined here as its recipe says, trained with in one run; and the
preset and sweep recipes.

The registries are process-wide: the toys get names no other test uses, and are removed again.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from end_to_end import EXPERIMENTS
from train_helpers import (
    CONFIGS,
    SWEEP_DATA,
    SWEEP_POINTS,
    compose,
    losses,
    metrics,
    tiny_overrides,
)

TOY_ACTIVATION, TOY_SOURCE, TOY_SCHEDULE = "toy_leaky_square", "toy_lines", "toy_halving"
TOY_OPTIMIZER, TOY_TOKENIZER = "toy_sgd", "toy_bytes"
BUILT: list[list[dict]] = []  # the parameter groups each toy optimizer was built over
LOADED: list[str | None] = []  # the path each toy tokenizer was loaded with


def toy_optimizer(groups: list[dict], optim, device) -> torch.optim.Optimizer:
    """SGD with momentum beta1, over the trainer's parameter groups."""
    BUILT.append(groups)
    return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.betas[0])


def toy_tokenizer(path: str | None):
    from data.tokenizers import ByteTokenizer

    LOADED.append(path)
    return ByteTokenizer()


def toy_activation():
    from xielu.interface import Activation

    class LeakySquare(Activation):
        def __init__(self, alpha_init: float = 0.1) -> None:
            super().__init__()
            self.alpha = nn.Parameter(torch.tensor([alpha_init]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.where(x > 0, x * x, self.alpha * x)

        def effective_scalars(self) -> dict[str, float]:
            return {"alpha": float(self.alpha)}

    return LeakySquare


def toy_rate(step: int, total: int, optim, schedule) -> float:
    """Warmup, then the rate halves every quarter of the run."""
    if step < schedule.warmup_steps:
        return optim.lr * (step + 1) / schedule.warmup_steps
    return optim.lr * 0.5 ** (4 * step // total)


def step_counter():
    from training.components import Component

    class StepCounter(Component):
        """A toy instrument with state: how many times it measured, over resumes too."""

        name, every = "toy_counter", 3

        def __init__(self) -> None:
            self.calls = 0

        def step_end(self, trainer, step: int) -> None:
            self.calls += 1
            weight = float(trainer.model.bare.norm.weight.detach().mean())
            trainer.log({"toy/calls": self.calls, "toy/final_norm_mean": weight}, console=False)

        def state_dict(self) -> dict:
            return {"calls": self.calls}

        def load_state_dict(self, state: dict) -> None:
            self.calls = state["calls"]

    return StepCounter()


def train_with_toys(root):
    """One run with every toy, registered the way docs/extending.md says, and removed again
    before it returns: (run dir, config, the instrument). One function, so that no other test
    of this worker process runs while the process-wide registries hold the toys."""
    from data.sources import SOURCES
    from data.text import TextSource, text_file_source
    from data.tokenizers import TOKENIZERS, TokenizerKind
    from eval.downstream import during_training
    from training.loop import train
    from training.optim import OPTIMIZERS, Optimizer, register_optimizer
    from training.schedule import _SCHEDULES, Schedule, register_schedule
    from xielu.registry import _REGISTRY as ACTIVATIONS
    from xielu.registry import register

    corpus = root / "lines.jsonl"
    lines = [f"Line {i} of the toy corpus says {i * i} is the square of {i}." for i in range(400)]
    corpus.write_text("".join(json.dumps({"text": t * 3}) + "\n" for t in lines))

    register(TOY_ACTIVATION, toy_activation(), "x^2 above 0, alpha x below", scalars=("alpha",))
    SOURCES[TOY_SOURCE] = text_file_source(
        TOY_SOURCE, "the toy lines", lambda config: TextSource([str(corpus)])
    )
    register_schedule(Schedule(TOY_SCHEDULE, toy_rate, "halves every quarter"))
    register_optimizer(TOY_OPTIMIZER, Optimizer(toy_optimizer, "SGD with momentum"))
    TOKENIZERS[TOY_TOKENIZER] = TokenizerKind(toy_tokenizer, "UTF-8 bytes under another name")
    try:
        run_dir = root / "run"
        overrides = tiny_overrides(
            root,
            run_dir,
            **{
                "data.source": TOY_SOURCE,
                "data.paths": "[]",
                "data.tokenizer.name": TOY_TOKENIZER,
                "model.activation": TOY_ACTIVATION,
                "schedule.name": TOY_SCHEDULE,
                "optim.name": TOY_OPTIMIZER,
                "optim.lr": 0.05,
                "trainer.steps": 12,
            },
        )
        overrides = [o for o in overrides if not o.startswith("data=")]
        config, config_yaml = compose(overrides)
        counter = step_counter()
        code = train(config, config_yaml, downstream=during_training, components=[counter])
        assert code == 0
        return run_dir, config, counter
    finally:
        ACTIVATIONS.pop(TOY_ACTIVATION, None)
        SOURCES.pop(TOY_SOURCE, None)
        _SCHEDULES.pop(TOY_SCHEDULE, None)
        OPTIMIZERS.pop(TOY_OPTIMIZER, None)
        TOKENIZERS.pop(TOY_TOKENIZER, None)


@pytest.mark.slow
def test_toys_of_every_kind_train_as_the_recipes_say(tmp_path):
    BUILT.clear()
    LOADED.clear()
    run_dir, config, counter = train_with_toys(tmp_path)
    logged = metrics(run_dir)

    # the optimizer: built once, from the table, over the trainer's parameter groups (the
    # activation's scalars in their own, undecayed); the tokenizer: loaded from its table
    assert config.optim.name == TOY_OPTIMIZER and len(BUILT) == 1
    assert [g["weight_decay"] for g in BUILT[0]][-1] == 0.0
    assert config.data.tokenizer.name == TOY_TOKENIZER and LOADED

    # the activation: built from the registry, its scalar trained and logged per layer
    assert config.model.activation == TOY_ACTIVATION
    alphas = [m["alpha/layer_00"] for m in logged if "alpha/layer_00" in m]
    assert len(alphas) == config.trainer.steps and alphas[-1] != pytest.approx(0.1, abs=1e-6)
    assert losses(run_dir)[config.trainer.steps] < losses(run_dir)[1]

    # the source: its documents were packed into the training windows
    assert config.data.source == TOY_SOURCE
    last = [m for m in logged if "data/documents" in m][-1]
    assert last["data/documents"] > 0 and last["data/bad_records"] == 0

    # the schedule: every step at its rate (logged at the step taken, 1-based)
    for m in (m for m in logged if "lr" in m):
        expected = toy_rate(m["step"] - 1, config.trainer.steps, config.optim, config.schedule)
        assert m["lr"] == pytest.approx(expected, rel=1e-12)

    # the instrument: logged at its steps, its state in the checkpoint
    assert [m["step"] for m in logged if "toy/calls" in m] == [3, 6, 9, 12]
    assert counter.calls == 4
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    assert json.loads((last / "trainer.json").read_text())["toy_counter"] == {"calls": 4}


def test_every_experiment_preset_is_in_the_end_to_end_tier():
    assert sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml")) == EXPERIMENTS


@pytest.mark.slow
@pytest.mark.xdist_group(SWEEP_POINTS)
@pytest.mark.parametrize("sweep", sorted(p.stem for p in (CONFIGS / "sweep").glob("*.yaml")))
def test_every_point_of_every_sweep_composes(sweep):
    from training.sweeps import check_run_dirs, expand, load_sweep, resolve

    jobs = expand(load_sweep(sweep), SWEEP_DATA)
    assert jobs
    for overrides in jobs:
        resolve(overrides)  # as train.py composes it, the launcher's hydra.* settings left out
    check_run_dirs(jobs)  # each its own directory, every name one a file system takes
