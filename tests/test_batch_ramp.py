"""The batch ramp (``training.batch_ramp``): every step's batch and tokens against a step-by-step
simulation of the rule, the schedule's position in the tokens, the refusals, and the hours."""

import random

import pytest

from scripts.estimate_sweep import job_cost
from train_helpers import compose
from training.batch_ramp import BatchPlan, check_batch_ramp
from training.config import ExperimentConfig, RampStage
from training.errors import ConfigError
from training.schedule import learning_rate, stable_phase_end


def experiment(steps: int, batch: int, seq: int, ramp: list[tuple[int, int]]) -> ExperimentConfig:
    config = ExperimentConfig()
    config.trainer.steps, config.trainer.global_batch, config.data.seq_len = steps, batch, seq
    config.trainer.micro_batch = 1
    config.trainer.batch_ramp = [RampStage(tokens, b) for tokens, b in ramp]
    return config


def simulate(config: ExperimentConfig) -> tuple[list[int], list[int]]:
    """The rule as stated: each step takes the last stage whose token count the tokens consumed
    before it have reached."""
    t, seq = config.trainer, config.data.seq_len
    batches, before, tokens = [], [], 0
    for _ in range(t.steps + 1):
        batch = t.global_batch
        for stage in t.batch_ramp:
            if tokens >= stage.tokens:
                batch = stage.global_batch
        batches.append(batch)
        before.append(tokens)
        tokens += batch * seq
    return batches, before


def test_every_step_takes_the_batch_and_tokens_the_rule_gives():
    rng = random.Random(0)
    for _ in range(200):
        steps, seq, batch = rng.randint(1, 300), rng.choice([1, 7, 32]), rng.randint(1, 8)
        thresholds = sorted(rng.sample(range(1, steps * 40 * seq), rng.randint(1, 4)))
        config = experiment(steps, batch, seq, [(x, rng.randint(1, 40)) for x in thresholds])
        plan = BatchPlan(config)
        batches, before = simulate(config)
        assert [plan.batch(s) for s in range(steps + 1)] == batches
        assert [plan.tokens_before(s) for s in range(steps + 1)] == before


def test_a_ramp_at_a_step_boundary_starts_at_that_step_and_one_inside_a_step_after_it():
    plan = BatchPlan(experiment(10, 4, 32, [(512, 8)]))  # 128 tokens a step: step 4 starts at 512
    assert [plan.batch(s) for s in range(6)] == [4, 4, 4, 4, 8, 8]
    plan = BatchPlan(experiment(10, 4, 32, [(513, 8)]))
    assert [plan.batch(s) for s in range(6)] == [4, 4, 4, 4, 4, 8]
    assert plan.at(5) == (8, 8)  # one rank, micro-batches of 1
    # two stages passed by the same step: the later one from that step on
    plan = BatchPlan(experiment(10, 4, 32, [(500, 8), (510, 16)]))
    assert [plan.batch(s) for s in range(6)] == [4, 4, 4, 4, 16, 16]


def test_without_a_ramp_the_schedule_reads_the_step_itself():
    config = experiment(97, 24, 4096, [])
    plan = BatchPlan(config)
    assert all(plan.position(s) == s for s in range(98))
    assert plan.step_at(stable_phase_end(config.schedule, 97)) == stable_phase_end(
        config.schedule, 97
    )


def test_with_a_ramp_warmup_and_cooldown_cover_the_same_share_of_the_tokens():
    config = experiment(1000, 8, 16, [(40_000, 16), (120_000, 32)])
    config.schedule.warmup_steps, config.schedule.decay_steps = 100, 200
    plan = BatchPlan(config)
    total = plan.tokens_before(1000)
    rates = [
        learning_rate(plan.position(s), 1000, config.optim, config.schedule) for s in range(1000)
    ]
    peak = config.optim.lr
    warmed = next(s for s, lr in enumerate(rates) if lr == peak)
    cooling = next(s for s in range(warmed, 1000) if rates[s] < peak)
    # the first step at the peak is the first read at position warmup - 1 = 99 or later: it has
    # consumed 9.9% of the tokens (to a step's share); the cooldown starts at 80% of them
    assert plan.tokens_before(warmed - 1) / total < 0.099 <= plan.tokens_before(warmed) / total
    assert max(rates) == peak  # the warmup's line is capped where a real position passes 99
    assert plan.tokens_before(cooling - 1) / total < 0.8 <= plan.tokens_before(cooling) / total
    assert plan.step_at(stable_phase_end(config.schedule, 1000)) == cooling
    assert plan.position(1000) == 1000 and plan.position(0) == 0
    assert plan.step_at(1000) == 1000 and plan.step_at(None) is None  # cosine: no stable end


@pytest.mark.parametrize(
    "ramp, world, message",
    [
        ([(0, 16)], 1, r"trainer\.batch_ramp\[0\]\.tokens=0 must be positive"),
        ([(100, 16), (100, 32)], 1, r"trainer\.batch_ramp\[1\]\.tokens=100 must be .*above"),
        ([(100, 12)], 8, r"trainer\.batch_ramp\[0\]\.global_batch=12 is not a positive multiple"),
        ([(100, 0)], 1, r"trainer\.batch_ramp\[0\]\.global_batch=0"),
    ],
)
def test_a_ramp_that_cannot_run_is_refused_naming_the_stage(ramp, world, message):
    with pytest.raises(ConfigError, match=message):
        check_batch_ramp(experiment(10, 8, 16, ramp), world)


def test_the_smallest_ramp_is_accepted():
    check_batch_ramp(experiment(10, 8, 16, [(1, 1)]), 1)  # from the first token, one sequence


def test_a_ramp_given_on_the_command_line_is_read_as_stages():
    config, _ = compose(["trainer.batch_ramp=[{tokens: 1000, global_batch: 16}]"])
    assert config.trainer.batch_ramp == [RampStage(1000, 16)]


def test_the_sweep_estimate_counts_the_tokens_of_every_stage():
    # configs/experiment/mixture_ramp.yaml: 120 steps of 8 sequences, then 180 of 16, x 256
    assert job_cost(["experiment=mixture_ramp"])["tokens"] == (120 * 8 + 180 * 16) * 256


def test_a_stage_that_shrinks_the_batch_is_run_as_asked_with_a_warning():
    """Warned, not refused: a smaller batch later in a run is a choice some make (a smaller
    batch for the cooldown), but more often a typo; the warning names the stage."""
    config = experiment(100, 16, 16, [(4_000, 32), (12_000, 8)])
    plan = BatchPlan(config)
    assert plan.batch(99) == 8
    (warning,) = plan.warnings()
    assert "trainer.batch_ramp[1].global_batch=8 is smaller than the 32 before it" in warning
    assert BatchPlan(experiment(100, 16, 16, [(4_000, 32)])).warnings() == []
    (first,) = BatchPlan(experiment(100, 16, 16, [(4_000, 8)])).warnings()
    assert "trainer.batch_ramp[0].global_batch=8 is smaller than the 16 before it" in first
    assert BatchPlan(experiment(100, 16, 16, [(4_000, 16)])).warnings() == []  # unchanged
