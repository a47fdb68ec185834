"""The loss-spike monitor on constructed series, and in the trainer."""

import json
import math
import random
import statistics

import pytest

from train_helpers import metrics, run_in_process, tiny_overrides
from training.errors import NonFiniteTrainingError
from training.instruments.spikes import MIN_HISTORY, SpikeMonitor
from training.step_health import StepHealth


def feed(monitor, series, skip=False):
    """Steps (0-based) the monitor flags in a loss series (grad norm held constant at 1)."""
    flagged = []
    for step, loss in enumerate(series):
        values = {"loss": loss, "grad_norm": 1.0}
        if monitor.check(values):
            flagged.append(step)
            if skip:
                continue
        monitor.record(values)
    return flagged


def test_the_known_spikes_of_a_noisy_falling_loss_are_flagged_and_nothing_else():
    # a falling loss with a deterministic wiggle; +1.0 jumps at steps 40 and 75
    series = [3.0 - 0.01 * i + 0.02 * math.sin(1.7 * i) for i in range(100)]
    series[40] += 1.0
    series[75] += 1.0
    monitor = SpikeMonitor(window=20, threshold=6.0)
    assert feed(monitor, series) == [40, 75]
    assert monitor.count == 2


def test_the_z_score_is_against_the_mean_and_spread_of_the_window_before_the_step():
    window = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0, 1.1, 0.9]
    monitor = SpikeMonitor(window=len(window), threshold=3.0)
    for value in window:
        monitor.record({"loss": value, "grad_norm": value})
    mean, std = statistics.fmean(window), statistics.pstdev(window)
    just_below = mean + 2.99 * std
    assert monitor.check({"loss": just_below, "grad_norm": 1.0}) == []
    (spike,) = monitor.check({"loss": mean + 3.01 * std, "grad_norm": 1.0})
    assert spike.metric == "loss" and spike.zscore == pytest.approx(3.01, rel=1e-9)
    assert spike.mean == pytest.approx(mean)
    # a falling value is never a spike, however far it falls
    assert monitor.check({"loss": mean - 100 * std, "grad_norm": 1.0}) == []


def test_nothing_is_flagged_before_the_window_has_enough_history():
    monitor = SpikeMonitor(window=50, threshold=1.0)
    series = [1.0, 1.1] * (MIN_HISTORY // 2) + [100.0]
    assert feed(monitor, series) == [MIN_HISTORY]  # the jump right after the minimum history
    early = SpikeMonitor(window=50, threshold=1.0)
    assert feed(early, [1.0, 1.1, 1.0, 50.0]) == []


def test_skipped_spikes_stay_out_of_the_window():
    series = [1.0 + 0.01 * (i % 3) for i in range(20)] + [5.0] * 4
    kept = SpikeMonitor(window=10, threshold=6.0)
    skipped = SpikeMonitor(window=10, threshold=6.0)
    assert feed(kept, series) == [20]  # recorded, the burst becomes the norm
    assert feed(skipped, series, skip=True) == [20, 21, 22, 23]


def test_non_finite_steps_stop_the_run_at_the_limit_and_a_healthy_step_resets_the_count():
    health = StepHealth(max_bad_steps=2, spikes=None, skip_spikes=False)
    for step, loss in enumerate([1.0, math.nan, 1.0, math.inf], start=1):
        update = health.should_update(loss, 1.0)
        assert update == math.isfinite(loss)
        health.settle(step, update, loss, 1.0, report=True)
    assert (health.skipped, health.bad_in_a_row) == (2, 1)
    assert not health.should_update(1.0, math.nan)
    with pytest.raises(NonFiniteTrainingError, match=r"2 consecutive.*max_bad_steps=2"):
        health.settle(5, False, 1.0, math.nan, report=True)
    assert health.state_dict() == {
        "skipped": 3,
        "bad_in_a_row": 2,
        "spikes_in_a_row": [],
        "spikes": None,
    }


def test_a_skipped_spike_is_counted_as_skipped_but_not_as_a_bad_step():
    health = StepHealth(max_bad_steps=1, spikes=SpikeMonitor(10, 3.0), skip_spikes=True)
    series = [1.0 + 0.01 * (i % 3) for i in range(MIN_HISTORY)] + [9.0]
    updates = []
    for step, loss in enumerate(series, start=1):
        updates.append(health.should_update(loss, 1.0))
        health.settle(step, updates[-1], loss, 1.0, report=False)  # max_bad_steps=1: no raise
    assert updates == [True] * MIN_HISTORY + [False]
    assert (health.skipped, health.bad_in_a_row, health.spike_count) == (1, 0, 1)
    restored = StepHealth(max_bad_steps=1, spikes=SpikeMonitor(10, 3.0), skip_spikes=True)
    restored.load_state_dict(health.state_dict())
    assert (restored.skipped, restored.spike_count) == (1, 1)
    # a resume may turn the monitor off (its window is dropped) or on (it starts empty)
    off = StepHealth(max_bad_steps=1, spikes=None, skip_spikes=False)
    off.load_state_dict(health.state_dict())
    assert (off.skipped, off.spike_count) == (1, None)
    on = StepHealth(max_bad_steps=1, spikes=SpikeMonitor(10, 3.0), skip_spikes=True)
    on.load_state_dict(off.state_dict())
    assert (on.skipped, on.spike_count) == (1, 0)


@pytest.mark.slow
@pytest.mark.mutation
@pytest.mark.parametrize("skip", [False, True])
def test_the_trainer_counts_spikes_logs_them_and_skips_them_only_when_asked(
    corpus, tmp_path, caplog, skip
):
    # a threshold so low that ordinary noise in the gradient norm counts as spikes
    overrides = tiny_overrides(
        corpus,
        tmp_path,
        **{
            "trainer.steps": 24,
            "spikes.window": 10,
            "spikes.threshold": 0.1,
            "spikes.skip": str(skip).lower(),
            "spikes.skip_limit": 1000,  # every spike skipped: none taken as a new level
        },
    )
    assert run_in_process(overrides) == 0
    last = [m for m in metrics(tmp_path) if "loss" in m][-1]
    assert last["spikes"] > 0
    assert last["skipped_steps"] == (last["spikes"] if skip else 0)
    assert caplog.text.count("spike") >= last["spikes"]


def level_shift(steps: int, shift_at: int, seed: int = 0) -> list[float]:
    """A gradient norm around 1.0 that moves to around 1.2 for good at ``shift_at``: what a
    learning-rate change does (noise 1%, so the shift is 20 standard deviations)."""
    rng = random.Random(seed)
    return [(1.2 if i >= shift_at else 1.0) + rng.gauss(0, 0.01) for i in range(steps)]


def judge(health: StepHealth, norms: list[float], start: int = 1) -> list[bool]:
    verdicts = []
    for step, norm in enumerate(norms, start=start):
        verdicts.append(health.should_update(2.0, norm))
        health.settle(step, verdicts[-1], 2.0, norm, report=False)
    return verdicts


def test_skipping_spikes_never_freezes_a_run_after_a_lasting_shift_of_the_level():
    """With a skipped spike kept out of the window, a lasting shift made
    every later step a spike (200 updates applied of 1000, exit 0). Now at most
    ``skip_limit`` spikes in a row are skipped, then the shift is the new level."""
    health = StepHealth(5, SpikeMonitor(100, 6.0), True, skip_limit=5)
    verdicts = judge(health, level_shift(1000, 200))
    assert all(verdicts[:200])  # the noise alone is no spike
    assert not any(verdicts[200:204])  # the first spikes of the burst are skipped ...
    assert verdicts[204]  # ... the fifth in a row is taken as the new level
    assert sum(verdicts) >= 990
    longest = max(len(run) for run in "".join("x" if v else "s" for v in verdicts).split("x"))
    assert longest <= 4
    assert health.skipped == 1000 - sum(verdicts)
    assert health.bad_in_a_row == 0  # skipped spikes are not non-finite steps


def test_each_spike_warning_says_what_became_of_the_update(caplog):
    """Skipped while the burst is shorter than the limit; applied, as the new level, at it."""
    health = StepHealth(5, SpikeMonitor(100, 6.0), True, skip_limit=3)
    norms = level_shift(203, 200)
    judge(health, norms[:200])
    with caplog.at_level("WARNING", logger="training.step_health"):
        for step, norm in enumerate(norms[200:], start=201):
            health.settle(step, health.should_update(2.0, norm), 2.0, norm, report=True)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == ["step 201", "step 202", "step 203"]
    assert all(line.endswith("; update skipped (spikes.skip)") for line in lines[:2])
    assert lines[2].endswith(
        "3 spikes in a row (spikes.skip_limit) are taken as a new level, which joins the window"
    )


@pytest.mark.slow
@pytest.mark.mutation
def test_a_resumed_spike_monitor_gives_the_verdicts_of_the_uninterrupted_one():
    """The window is part of the state, so a run stopped and resumed at
    any step skips exactly the steps the uninterrupted run skips (count, streak and window)."""
    norms = level_shift(400, 150, seed=1) + [3.0, 1.2, 3.1, 3.2, 1.21, 1.19] * 5

    def fresh() -> StepHealth:
        return StepHealth(5, SpikeMonitor(50, 4.0), True, skip_limit=3)

    whole = judge(fresh(), norms)
    assert not all(whole)  # the series has skipped spikes to reproduce
    for stop in (12, 151, 152, 401, 403):
        first = fresh()
        before = judge(first, norms[:stop])
        saved = json.loads(json.dumps(first.state_dict()))  # as trainer.json holds it
        resumed = fresh()
        resumed.load_state_dict(saved)
        after = judge(resumed, norms[stop:], start=stop + 1)
        assert before + after == whole, stop
        assert (resumed.skipped, resumed.spike_count) == (
            whole.count(False),
            fresh_count(norms),
        )


def fresh_count(norms: list[float]) -> int:
    health = StepHealth(5, SpikeMonitor(50, 4.0), True, skip_limit=3)
    judge(health, norms)
    return health.spike_count
