"""Learning-rate schedules pinned at every phase boundary, and the registry that maps
``schedule.name`` to them."""

import json
import math
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from scripts.results_table import summarise
from training import schedule as schedules
from training.checks import check_config as validate
from training.config import ExperimentConfig, TrainerConfig
from training.errors import ConfigError
from training.optim import OptimConfig
from training.schedule import (
    Schedule,
    ScheduleConfig,
    available_schedules,
    cosine,
    learning_rate,
    register_schedule,
    stable_phase_end,
    wsd,
)

LR, MIN = 8e-4, 1e-5


def test_wsd_warmup_is_linear_and_reaches_the_peak():
    assert wsd(0, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR / 10)
    assert wsd(4, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR / 2)
    assert wsd(9, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR)


def test_wsd_is_constant_until_the_cooldown_starts():
    assert wsd(10, 100, LR, MIN, 10, 20, "1-sqrt") == LR
    assert wsd(79, 100, LR, MIN, 10, 20, "1-sqrt") == LR
    assert wsd(80, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(LR)  # p = 0


def test_wsd_cooldown_follows_one_minus_sqrt():
    for step in (85, 90, 99):
        p = (step - 80) / 20
        expected = MIN + (LR - MIN) * (1 - math.sqrt(p))
        assert wsd(step, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(expected)
    assert wsd(100, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(MIN)


@pytest.mark.parametrize(
    "shape,f", [("linear", lambda p: 1 - p), ("cosine", lambda p: (1 + math.cos(math.pi * p)) / 2)]
)
def test_wsd_other_cooldown_shapes(shape, f):
    # p = 0.5 alone cannot tell the cosine from (1 - cos) / 2 or 0.5 / (1 + cos): all give 0.5
    for step in (85, 90, 95):
        p = (step - 80) / 20
        assert wsd(step, 100, LR, MIN, 10, 20, shape) == pytest.approx(MIN + (LR - MIN) * f(p))


def test_an_unknown_cooldown_shape_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"schedule\.decay_shape='square' is not one of"):
        wsd(90, 100, LR, MIN, 10, 20, "square")


def test_past_the_last_step_both_schedules_hold_the_floor():
    """A schedule asked beyond its total (a plot, a run extended by hand) stays at min_lr
    instead of turning back up."""
    for step in (100, 110, 150):
        assert wsd(step, 100, LR, MIN, 10, 20, "1-sqrt") == pytest.approx(MIN)
        assert wsd(step, 100, LR, MIN, 10, 20, "cosine") == pytest.approx(MIN)
        assert cosine(step, 100, LR, MIN, 10) == pytest.approx(MIN)
    # one step after the warmup: the whole decay lasts one step
    assert cosine(10, 11, LR, MIN, 10) == pytest.approx(LR)
    assert cosine(11, 11, LR, MIN, 10) == pytest.approx(MIN)


def test_paper_1b_schedule_phases():
    # 2000 warmup + 53500 stable + 14500 cooldown = 70000 steps, min lr 0
    assert wsd(1999, 70000, 8e-4, 0.0, 2000, 14500, "1-sqrt") == pytest.approx(8e-4)
    assert wsd(55499, 70000, 8e-4, 0.0, 2000, 14500, "1-sqrt") == 8e-4
    quarter = 55500 + 14500 // 4
    assert wsd(quarter, 70000, 8e-4, 0.0, 2000, 14500, "1-sqrt") == pytest.approx(
        8e-4 * (1 - math.sqrt(0.25)), rel=1e-3
    )


def test_cosine_warmup_then_half_cosine_to_min():
    # the ablation schedule: 6e-4 -> 6e-5 after 200 warmup steps, 50000 steps in all
    assert cosine(199, 50000, 6e-4, 6e-5, 200) == pytest.approx(6e-4)
    assert cosine(200, 50000, 6e-4, 6e-5, 200) == pytest.approx(6e-4)
    assert cosine(200 + 24900, 50000, 6e-4, 6e-5, 200) == pytest.approx(3.3e-4)
    assert cosine(50000, 50000, 6e-4, 6e-5, 200) == pytest.approx(6e-5)


def test_learning_rate_is_the_registered_formula_bit_for_bit():
    optim = OptimConfig(lr=LR, min_lr=MIN)
    for shape in ("1-sqrt", "linear", "cosine"):
        config = ScheduleConfig("wsd", warmup_steps=10, decay_steps=20, decay_shape=shape)
        for step in range(0, 105):
            assert learning_rate(step, 100, optim, config) == wsd(step, 100, LR, MIN, 10, 20, shape)
    config = ScheduleConfig("cosine", warmup_steps=10, decay_steps=0, decay_shape="cosine")
    for step in range(0, 105):
        assert learning_rate(step, 100, optim, config) == cosine(step, 100, LR, MIN, 10)


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry for the test to add to, so that its schedules leave with it."""
    monkeypatch.setattr(schedules, "_SCHEDULES", dict(schedules._SCHEDULES))


def test_a_registered_schedule_is_accepted_by_validate_and_used_by_learning_rate(registry):
    register_schedule(Schedule("constant", lambda step, total, optim, s: optim.lr, "constant"))
    config = ExperimentConfig(schedule=ScheduleConfig(name="constant"))
    validate(config)
    assert "constant" in available_schedules()
    assert learning_rate(0, 100, config.optim, config.schedule) == config.optim.lr
    assert learning_rate(99, 100, config.optim, config.schedule) == config.optim.lr
    assert stable_phase_end(config.schedule, 100) is None


def test_a_schedule_s_own_check_runs_in_validate(registry):
    def check(s: ScheduleConfig, steps: int) -> None:
        raise ConfigError(f"schedule.decay_steps={s.decay_steps} is not welcome here")

    register_schedule(Schedule("picky", lambda *_: 1.0, "refuses everything", check=check))
    with pytest.raises(ConfigError, match=r"schedule\.decay_steps=20 is not welcome"):
        validate(ExperimentConfig(schedule=ScheduleConfig(name="picky")))


def test_a_schedule_registered_twice_is_an_error(registry):
    with pytest.raises(ValueError, match="'wsd' is registered twice"):
        register_schedule(Schedule("wsd", lambda *_: 1.0, "again"))


def test_an_unknown_schedule_is_refused_naming_the_key_and_the_registered_names(registry):
    register_schedule(Schedule("constant", lambda *_: 1.0, "constant"))
    with pytest.raises(
        ConfigError, match=r"^schedule\.name='cosin' is not one of wsd, cosine, constant$"
    ):
        ExperimentConfig(schedule=ScheduleConfig(name="cosin"))
    config = ExperimentConfig()
    config.schedule.name = "cosin"  # changed after it was checked
    with pytest.raises(ConfigError, match=r"^schedule\.name='cosin' is not one of"):
        validate(config)
    with pytest.raises(ConfigError, match=r"schedule\.name='cosin'"):
        learning_rate(0, 100, config.optim, config.schedule)


def _config(steps: int = 100, **schedule) -> ExperimentConfig:
    return ExperimentConfig(schedule=ScheduleConfig(**schedule), trainer=TrainerConfig(steps=steps))


def test_wsd_refuses_an_unknown_cooldown_shape_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"^schedule\.decay_shape='square' is not one of 1-sqrt, linear, cosine$"
    ):
        validate(_config(decay_shape="square"))


def test_wsd_warmup_and_cooldown_must_fit_in_the_run_and_cosine_ignores_decay_steps():
    validate(_config(steps=30, warmup_steps=10, decay_steps=20))
    with pytest.raises(
        ConfigError,
        match=r"^schedule\.warmup_steps=11 \+ schedule\.decay_steps=20 is longer than "
        r"trainer\.steps=30$",
    ):
        validate(_config(steps=30, warmup_steps=11, decay_steps=20))
    # cosine has no cooldown of its own and ignores decay_shape; only its warmup must fit
    validate(_config(steps=30, name="cosine", warmup_steps=30, decay_steps=20, decay_shape="x"))
    with pytest.raises(
        ConfigError, match=r"^schedule\.warmup_steps=31 is longer than trainer\.steps=30$"
    ):
        validate(_config(steps=30, name="cosine", warmup_steps=31))


def test_no_warmup_and_no_cooldown_are_settings_not_errors():
    """Both lengths are bounded at 0 inclusive: a run may start at the peak and hold it."""
    validate(_config(warmup_steps=0, decay_steps=0))
    validate(_config(name="cosine", warmup_steps=0, decay_steps=0))
    optim = OptimConfig(lr=LR, min_lr=MIN)
    config = ScheduleConfig("wsd", warmup_steps=0, decay_steps=0)
    assert [learning_rate(s, 100, optim, config) for s in (0, 50, 99)] == [LR] * 3


def test_the_stable_phase_ends_where_the_wsd_cooldown_starts_and_only_there():
    assert stable_phase_end(ScheduleConfig("wsd", decay_steps=20), 100) == 80
    assert stable_phase_end(ScheduleConfig("wsd", decay_steps=14500), 70000) == 55500
    # no cooldown: the stable phase runs to the end, no separate point to report
    assert stable_phase_end(ScheduleConfig("wsd", decay_steps=0), 100) is None
    assert stable_phase_end(ScheduleConfig("cosine", decay_steps=20), 100) is None


def test_the_results_table_reports_no_stable_loss_for_wsd_without_a_cooldown(tmp_path):
    """It used to report the final loss as the end of the stable phase (steps - 0)."""
    for name, decay, stable in (("with", 20, 3.5), ("without", 0, None)):
        run = tmp_path / name
        run.mkdir()
        config = _config(decay_steps=decay)
        config = replace(config, trainer=replace(config.trainer, run_dir=str(run)))
        (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
        records = [{"step": 80, "val/loss": 3.5}, {"step": 100, "val/loss": 3.0}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        row = summarise(str(run))
        assert (row["stable_loss"], row["final_loss"]) == (stable, 3.0)


# positions a batch ramp hands the schedule (``training.batch_ramp``): real numbers, not steps
POSITIONS = [k / 8 for k in range(0, 8 * 110)] + [9.9999, 10 - 1e-9, 79.5, 99.75]


@pytest.mark.parametrize(
    "name, warmup, decay, shape",
    [
        ("wsd", 10, 20, "1-sqrt"),
        ("wsd", 10, 20, "linear"),
        ("wsd", 10, 20, "cosine"),
        ("wsd", 1, 0, "1-sqrt"),
        ("cosine", 10, 0, "1-sqrt"),
        ("cosine", 3, 0, "1-sqrt"),
    ],
)
def test_every_schedule_stays_within_its_bounds_at_any_real_position(name, warmup, decay, shape):
    """Never above the peak anywhere; during warmup a rise from above 0, after it never below
    min_lr; and at whole steps the formula of the docstrings, unchanged."""
    optim = OptimConfig(lr=LR, min_lr=MIN)
    config = ScheduleConfig(name, warmup_steps=warmup, decay_steps=decay, decay_shape=shape)
    rates = [learning_rate(p, 100, optim, config) for p in POSITIONS]
    for position, rate in zip(POSITIONS, rates, strict=True):
        assert 0 < rate <= LR, (position, rate)
        if position >= warmup:
            assert rate >= MIN, (position, rate)
    warming = [rate for position, rate in zip(POSITIONS, rates, strict=True) if position < warmup]
    assert warming == sorted(warming)
    for step in range(warmup):
        assert learning_rate(step, 100, optim, config) == pytest.approx(LR * (step + 1) / warmup)
