"""The loss-spike monitor on constructed series, and in the trainer."""

import math
import statistics

import pytest

from train_helpers import metrics, run_in_process, tiny_overrides
from training.spikes import MIN_HISTORY, SpikeMonitor
from training.step_health import NonFiniteTrainingError, StepHealth


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
    assert health.state_dict() == {"skipped": 3, "bad_in_a_row": 2, "spikes": 0}


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


@pytest.mark.slow
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
            "trainer.spike_window": 10,
            "trainer.spike_threshold": 0.1,
            "trainer.spike_skip": str(skip).lower(),
        },
    )
    assert run_in_process(overrides) == 0
    last = [m for m in metrics(tmp_path) if "loss" in m][-1]
    assert last["spikes"] > 0
    assert last["skipped_steps"] == (last["spikes"] if skip else 0)
    assert caplog.text.count("spike") >= last["spikes"]
