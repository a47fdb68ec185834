"""The step's log line (``training/instruments/step_log.py``) against its definitions, with the
clock and the trainer replaced so that every value has a closed form."""

import math
from types import SimpleNamespace

import pytest
import torch

from model import ModelConfig, training_flops_per_token
from training.instruments import step_log
from training.instruments.step_log import StepLog, mixture_shares
from training.runtime.distributed import Env

SEQ = 16
MODEL = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=2, gated_hidden=64)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Logger:
    def __init__(self) -> None:
        self.records, self.tables = [], []

    def log(self, step, record):
        self.records.append((step, record))

    def log_alpha_table(self, step, per_layer):
        self.tables.append((step, per_layer))


def trainer(stats, *, step, loss, rank=0):
    per_layer = [{"alpha_p": 0.8, "alpha_n": 0.5}, {"alpha_p": 0.9, "alpha_n": 0.4}]
    logger = Logger()
    return SimpleNamespace(
        env=Env(rank=rank, world_size=1, local_rank=0, device=torch.device("cpu")),
        config=SimpleNamespace(
            data=SimpleNamespace(seq_len=SEQ), trainer=SimpleNamespace(steps=50)
        ),
        model=SimpleNamespace(activation_scalars=lambda: per_layer),
        loader=SimpleNamespace(
            state_dict=lambda: {"worker_0": {"dataset_state": {"pending": {"stats": stats}}}}
        ),
        record={"loss": loss, "lr": 1e-3},
        tokens=7 * 4 * SEQ,
        global_batch=4,
        step=step,
        logger=logger,
        log=lambda record, console=True, step=None: logger.log(step, record),  # Trainer.log's
    )


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    # the module's own clock, not the process's: pytest times the test with perf_counter too
    monkeypatch.setattr(step_log, "time", SimpleNamespace(perf_counter=clock))
    return clock


def logged_step(clock, stats, *, step=7, loss=2.0, started_at=4, peak=None, rank=0):
    """Begin at ``started_at`` at t=97, then step ``step`` taking 0.5 s, ending at t=103."""
    log = StepLog(every=1, model_config=MODEL, seq_len=SEQ, device=torch.device("cpu"))
    log.peak = peak
    t = trainer(stats, step=started_at, loss=loss, rank=rank)
    clock.now = 97.0
    log.begin(t)
    t.step = step
    clock.now = 102.5
    log.step_start(t, step)
    clock.now = 103.0
    log.after_update(t, step, stepped=True)
    log.step_end(t, step)
    return t


def test_the_line_holds_the_steps_speed_eta_and_counters(clock):
    t = logged_step(clock, {"documents": 3, "tokens": 90, "other": 5})
    (step, record), (table_step, per_layer) = t.logger.records[0], t.logger.tables[0]
    assert step == table_step == 7 and len(t.logger.records) == 1
    assert per_layer == t.model.activation_scalars()
    assert record["loss"] == 2.0 and record["lr"] == 1e-3  # the step's own values, as given
    assert record["perplexity"] == pytest.approx(math.exp(2.0))
    assert record["step_time_s"] == pytest.approx(0.5)
    assert record["tokens_per_s"] == pytest.approx(4 * SEQ / 0.5)
    assert (record["tokens"], record["global_batch"]) == (7 * 4 * SEQ, 4)
    # 3 steps in 6 s since the run (re)started at step 4: 43 left at 0.5 steps per second
    assert record["eta_s"] == pytest.approx(86.0)
    assert record["alpha_p/layer_01"] == 0.9 and record["alpha_n/layer_00"] == 0.5
    assert record["data/documents"] == 3 and record["data/tokens"] == 90
    assert record["data/bad_records"] == 0 and "data/other" not in record
    assert "mfu" not in record  # no peak known for a CPU
    assert not any(k.startswith("data/share/") for k in record)


def test_mfu_is_the_flops_per_second_per_rank_over_the_peak(clock):
    t = logged_step(clock, {}, peak=1e9)
    record = t.logger.records[0][1]
    flops = training_flops_per_token(MODEL, SEQ)
    assert record["mfu"] == pytest.approx(4 * SEQ / 0.5 * flops / 1e9)


def test_a_diverged_loss_logs_a_finite_perplexity(clock):
    record = logged_step(clock, {}, loss=1e4).logger.records[0][1]
    assert record["perplexity"] == pytest.approx(math.exp(50))


def test_other_ranks_reduce_with_rank_0_and_log_nothing(clock):
    t = logged_step(clock, {"documents": 3}, rank=1)
    assert t.logger.records == [] and t.logger.tables == []


def test_mixture_shares_are_each_sources_part_of_the_mixed_tokens(clock):
    stats = {"tokens": 40, "mixture/web": 30, "mixture/code": 10}
    record = logged_step(clock, stats).logger.records[0][1]
    assert record["data/share/web"] == pytest.approx(0.75)
    assert record["data/share/code"] == pytest.approx(0.25)
    assert record["data/mixture/web"] == 30
    assert mixture_shares({"tokens": 5, "mixture/web": 0, "mixture/code": 0}) == {}
    assert mixture_shares({"tokens": 5}) == {}
