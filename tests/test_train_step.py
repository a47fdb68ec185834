"""What the trainer does with its parts, against independent truth: the learning rate it sets at
each step (the schedule's closed form, written out here), and the gradient clipping it applies
(a hand-computed clipped gradient, read back from AdamW's first moment).

The parts have their own tests (``test_schedule``, ``test_loss``); these catch a trainer that
calls a correct part with the wrong arguments.
"""

import copy
import math

import pytest
import torch

from train_helpers import compose, metrics, run_in_process, tiny_overrides
from training.loop import Trainer


def wsd_1_sqrt(step: int, total: int, peak: float, floor: float, warmup: int, decay: int):
    """Hägele et al.'s warmup-stable-decay with the 1-sqrt cooldown, 0-based steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step < total - decay:
        return peak
    p = (step - (total - decay)) / decay
    return floor + (peak - floor) * (1 - math.sqrt(p))


def cosine(step: int, total: int, peak: float, floor: float, warmup: int):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / (total - warmup)
    return floor + (peak - floor) * (1 + math.cos(math.pi * p)) / 2


def logged_lr(run_dir) -> dict[int, float]:
    """The lr logged with each step's record: the rate that step (1-based) was taken at."""
    return {m["step"]: m["lr"] for m in metrics(run_dir) if "lr" in m}


def test_the_trainer_takes_step_n_at_the_wsd_rate_of_step_n(corpus, reference):
    """The reference run: wsd, 1-sqrt, warmup 2, decay 4 of 12 steps; the record of step s
    (1-based) carries the rate of 0-based step s - 1. A trainer that looks one step ahead, or
    applies another schedule, logs other numbers."""
    run_dir, _ = reference
    config, _ = compose(tiny_overrides(corpus, run_dir))
    peak, floor = config.optim.lr, config.optim.min_lr
    assert (config.schedule.name, config.schedule.decay_shape) == ("wsd", "1-sqrt")
    expected = {s + 1: wsd_1_sqrt(s, 12, peak, floor, 2, 4) for s in range(12)}
    assert logged_lr(run_dir) == pytest.approx(expected, rel=1e-12)
    assert expected[1] == peak / 2 and expected[12] < peak  # the warmup and the cooldown show


@pytest.mark.slow
@pytest.mark.mutation
def test_the_trainer_follows_the_cosine_schedule_when_asked(corpus, tmp_path):
    overrides = tiny_overrides(
        corpus,
        tmp_path,
        **{
            "schedule.name": "cosine",
            "trainer.steps": 6,
            "validation.every": 0,
            "checkpoint.every": 0,
            "optim.min_lr": 1e-4,
        },
    )
    assert run_in_process(overrides) == 0
    config, _ = compose(overrides)
    peak = config.optim.lr
    expected = {s + 1: cosine(s, 6, peak, 1e-4, 2) for s in range(6)}
    assert logged_lr(tmp_path) == pytest.approx(expected, rel=1e-12)


def test_a_clipped_step_hands_adamw_the_hand_clipped_gradient_at_the_schedules_rate(
    corpus, tmp_path
):
    """One step of two accumulated micro-batches at grad_clip far below the gradient norm,
    against the same computation by hand on a copy of the model:

    - the logged loss is the mean of the two micro-batch losses;
    - AdamW's first moment after its first step is (1 - beta1) times the gradient it was given:
      the gradient of that mean, scaled by clip / norm (the logged norm is the one before);
    - an undecayed parameter (a norm weight) moves by -lr g / (|g| + eps), the first Adam step,
      at the schedule's first rate lr / warmup: the rate is applied, not only logged.
    """
    clip = 1e-3
    overrides = tiny_overrides(
        corpus,
        tmp_path,
        **{"optim.grad_clip": clip, "trainer.global_batch": 4, "trainer.micro_batch": 2},
    )
    config, config_yaml = compose(overrides)
    trainer = Trainer(config, config_yaml)
    assert trainer.accumulation == 2
    loader = iter(trainer.loader)
    batches = [next(loader), next(loader)]
    replica = copy.deepcopy(trainer.model.bare)
    losses = [replica(b["inputs"], b["targets"], b.get("document_ids")) for b in batches]
    mean_loss = (losses[0] + losses[1]) / 2
    mean_loss.backward()
    grads = [p.grad.detach().clone() for p in replica.parameters()]
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    assert norm > 100 * clip  # clipping is active: a silent no-op would fail below
    params = list(trainer.model.bare.parameters())
    before = [p.detach().clone() for p in params]

    trainer._train_step(iter(batches))
    record = trainer.record
    assert record["loss"] == pytest.approx(float(mean_loss.detach()), rel=1e-6)
    assert record["grad_norm"] == pytest.approx(norm, rel=1e-5)
    beta1, eps = config.optim.betas[0], config.optim.eps
    lr = config.optim.lr / config.schedule.warmup_steps
    assert record["lr"] == pytest.approx(lr)
    for param, grad, old in zip(params, grads, before, strict=True):
        clipped = grad * (clip / norm)
        first_moment = trainer.optimizer.state[param]["exp_avg"]
        torch.testing.assert_close(first_moment, (1 - beta1) * clipped)
        if param.ndim == 1:  # norm weights: no weight decay, the bare Adam step
            step = -lr * clipped / (clipped.abs() + eps)
            torch.testing.assert_close(param.detach() - old, step, rtol=1e-3, atol=1e-8)


def tiny_model():
    """A tiny float64 Llama, the same weights at every call."""
    from model import Llama, ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=12, dim=16, n_layers=2, n_heads=2, gated_hidden=32)
    return Llama(config).double()


def tiny_step(batches: list[dict], phases: list[str] | None = None):
    """``train_step`` over ``batches`` (one micro-batch each) for ``tiny_model()`` on one
    process, with SGD at rate 1 and no clipping: the step's result and the trained model."""
    from training.runtime.distributed import Env
    from training.runtime.parallelize import ParallelConfig, parallelize
    from training.step import train_step

    model = tiny_model()
    trained = parallelize(model, Env(0, 1, 0, torch.device("cpu")), ParallelConfig())
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    on_phase = phases.append if phases is not None else (lambda phase: None)
    result = train_step(trained, optimizer, iter(batches), len(batches), 0.0, on_phase=on_phase)
    return result, model


def test_the_step_hands_the_model_the_document_ids_and_sums_the_loss_in_float64():
    from data.packing import document_index

    ids = torch.randint(0, 12, (2, 17), generator=torch.Generator().manual_seed(6))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    documents = torch.stack([document_index(row, eos_id=3) for row in inputs])
    assert documents.max() > 0  # an end of document inside the window: the mask matters
    result, _ = tiny_step([{"inputs": inputs, "targets": targets, "document_ids": documents}])
    model = tiny_model()
    with torch.no_grad():
        within, across = float(model(inputs, targets, documents)), float(model(inputs, targets))
    assert result.loss_sum.dtype == torch.float64
    assert float(result.loss_sum) == pytest.approx(within, rel=1e-12)
    assert abs(within - across) > 1e-6


def test_the_step_names_its_phases_reports_the_gradient_norm_and_frees_the_gradients():
    ids = torch.randint(0, 12, (2, 9), generator=torch.Generator().manual_seed(7))
    batches = [{"inputs": row[None, :-1], "targets": row[None, 1:]} for row in ids]
    phases: list[str] = []
    result, model = tiny_step(batches, phases)
    assert phases == ["forward 1", "backward 1", "forward 2", "backward 2", "optimizer"]
    assert all(p.grad is None for p in model.parameters())  # freed, not zeroed
    # SGD at rate 1 moved each weight by its gradient: the norm reported is that update's
    with torch.no_grad():
        update = [a - b for a, b in zip(tiny_model().parameters(), model.parameters(), strict=True)]
    norms = torch.stack([torch.linalg.vector_norm(u) for u in update])
    assert float(result.grad_norm) == pytest.approx(float(torch.linalg.vector_norm(norms)))
