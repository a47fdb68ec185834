"""The loss-spike monitor on constructed series, and in the trainer."""

import math
import statistics

import pytest

from train_helpers import metrics, run_in_process, tiny_overrides
from training.spikes import MIN_HISTORY, SpikeMonitor


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
