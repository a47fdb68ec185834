"""Faults a cluster run meets, each injected for real: what is observed, and that nothing is lost.

README's "Runs that survive the cluster" table summarises these. Every rerun must reproduce the
uninterrupted run's losses exactly (or to fp rounding across world sizes).
"""

import errno
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from faults import fault_components, faults_env
from train_helpers import (
    assert_same_losses,
    losses,
    metrics,
    run,
    run_in_process,
    run_launched,
    tiny_overrides,
)
from training import checkpoint, loop
from training.checkpoint import CheckpointWriter
from training.instruments import measurements
from training.instruments.metrics import SUPERSEDED_FILE


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.slow
@pytest.mark.mutation
def test_a_full_disk_during_a_save_is_a_clear_error_and_the_previous_checkpoint_survives(
    corpus, reference, tmp_path, monkeypatch, caplog, asynchronous
):
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def disk_full_at_step_8(self, plan, planner):
        if "step_000008" in str(self.path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_data(self, plan, planner)

    overrides = tiny_overrides(corpus, tmp_path, **{"checkpoint.async_write": asynchronous})
    with monkeypatch.context() as patch:
        patch.setattr(FileSystemWriter, "write_data", disk_full_at_step_8)
        with caplog.at_level(logging.ERROR):
            assert run_in_process(overrides) == loop.EXIT_CHECKPOINT_FAILED
    message = caplog.text
    assert "step 8" in message and "No space left on device" in message
    assert "step_000004 is intact" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000004"]
    assert run_in_process(overrides) == 0  # space freed: resumes from step 4
    assert_same_losses(tmp_path, reference[1])


def sigterm_to_self(*_, **__) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("during", ["validation", "save"])
@pytest.mark.slow
@pytest.mark.mutation
def test_sigterm_during_validation_or_a_save_ends_with_a_valid_checkpoint(
    corpus, reference, tmp_path, monkeypatch, during
):
    """The handler only sets a flag: the pass or the save in progress completes, the next step
    checkpoints and the run exits to be requeued; the rerun reproduces every loss."""
    if during == "validation":  # the first validation pass is at step 6
        validation_loss = measurements.validation_loss

        def interrupted(*args, **kwargs):
            sigterm_to_self()
            return validation_loss(*args, **kwargs)

        target, replacement, stopped_at = measurements, ("validation_loss", interrupted), 7
    else:  # the checkpoint of step 4
        write = CheckpointWriter._write_small_files

        def interrupted(self, tmp, *args):
            if tmp.name.startswith("step_000004"):
                sigterm_to_self()
            return write(self, tmp, *args)

        target, replacement, stopped_at = CheckpointWriter, ("_write_small_files", interrupted), 5
    overrides = tiny_overrides(corpus, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(target, *replacement)
        assert run_in_process(overrides) == 75  # EXIT_PREEMPTED: no SLURM here to requeue
    newest = checkpoint.complete_checkpoints(tmp_path)[-1]
    assert checkpoint.step_of(newest) == stopped_at
    assert run_in_process(overrides) == 0
    assert_same_losses(tmp_path, reference[1])


@pytest.mark.slow
@pytest.mark.mutation
def test_a_stop_at_a_measurement_step_measures_that_step_first_on_resume(corpus, tmp_path, capsys):
    """Stopped once step 6's update is done, before its measurements: they are pending in the
    checkpoint, and the resumed run takes them on those weights before step 7; step 0's are
    not taken again."""
    overrides = tiny_overrides(corpus, tmp_path, **{"logging.diagnostics_every": 6})
    assert run_in_process(overrides, fault_components(signal="SIGTERM@6")) == 75

    def steps(key):
        return [m["step"] for m in metrics(tmp_path) if key in m]

    assert steps("val/loss") == [] and steps("diag/pre_rms/layer_00") == [0]
    assert "validation loss" not in capsys.readouterr().out  # no closing summary at a stop
    assert run_in_process(overrides) == 0
    assert "\nvalidation loss" in capsys.readouterr().out
    assert steps("val/loss") == [6, 8, 12]  # 8: the end of the stable phase
    assert steps("diag/pre_rms/layer_00") == [0, 6, 12]
    assert steps("loss") == list(range(1, 13))
    # resumed, not started again: nothing the stopped attempt logged was set aside
    assert not (tmp_path / SUPERSEDED_FILE).exists()


@pytest.mark.slow
@pytest.mark.mutation
@pytest.mark.parametrize(("sig", "requeued"), [("SIGUSR1", True), ("SIGTERM", False)])
def test_a_stop_asks_for_a_requeue_only_for_the_signals_that_ask_for_one(
    sig, requeued, corpus, tmp_path, caplog, monkeypatch
):
    """SIGUSR1 (SLURM: the time limit is near) has rank 0 requeue the job; SIGTERM (scancel, a
    preemption the scheduler requeues itself) does not. Outside SLURM both exit 75."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    extra = {"trainer.steps": 4, "schedule.warmup_steps": 1, "schedule.decay_steps": 2}
    with caplog.at_level(logging.WARNING, logger="training.runtime.preemption"):
        code = run_in_process(
            tiny_overrides(corpus, tmp_path, **extra), fault_components(signal=f"{sig}@2")
        )
    assert code == 75
    assert ("stopping at step 2; requeueing the job" in caplog.text) == requeued
    assert (
        "stopping at step 2, its newest good checkpoint on disk, not requeued" in caplog.text
    ) == (not requeued)


@pytest.mark.slow
@pytest.mark.mutation
def test_a_non_finite_activation_scalar_gradient_skips_the_step(corpus, tmp_path, monkeypatch):
    build_model = loop.build_model
    backward_calls = []

    def with_an_overflowing_alpha(*args, **kwargs):
        model = build_model(*args, **kwargs)
        alpha_p = model.layers[0].mlp.act_fn.alpha_p

        def overflow_once(grad):
            backward_calls.append(1)
            return torch.full_like(grad, torch.inf) if len(backward_calls) == 5 else grad

        alpha_p.register_hook(overflow_once)
        return model

    monkeypatch.setattr(loop, "build_model", with_an_overflowing_alpha)
    assert run_in_process(tiny_overrides(corpus, tmp_path)) == 0
    records = [m for m in metrics(tmp_path) if "loss" in m]
    assert records[-1]["skipped_steps"] == 1  # the 5th backward is step 3's first micro-batch
    assert [m["step"] for m in records if m["grad_norm"] == float("inf")] == [3]
    assert all(abs(m["alpha_p/layer_00"]) < 10 for m in records)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a run directory is unique to a
    test, so this finds that run's ranks wherever they were reparented)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_kill_9_of_one_of_two_ranks_stops_the_other_and_the_rerun_resumes(corpus, tmp_path):
    single_dir = tmp_path / "single"
    single = tiny_overrides(corpus, single_dir, **{"data.num_workers": 2})
    assert run_in_process(single) == 0  # one process with 2 workers = 2 ranks with 1 each
    run_dir = tmp_path / "two"
    overrides = tiny_overrides(corpus, run_dir, **{"data.num_workers": 1})
    # rank 1 SIGKILLs itself once step 5 is done: after the step-4 checkpoint, mid-interval
    # the real launcher: the check of ranks left behind reads their command lines
    kill = faults_env(signal="SIGKILL@5@1")
    code, output = run_launched(overrides, torchrun=2, timeout=240, env=kill)
    assert code != 0, output[-3000:]  # the survivor is stopped, not left hanging (timeout)
    assert "SIGKILL" in output, output[-3000:]
    assert max(losses(run_dir)) <= 6  # rank 0 may log one more step before it is stopped
    assert processes_mentioning(str(run_dir)) == []  # no rank left behind
    code, output = run(overrides, ranks=2, timeout=240)
    assert code == 0 and "resumed from" in output, output[-3000:]
    assert_same_losses(run_dir, losses(single_dir), rel=1e-5)
