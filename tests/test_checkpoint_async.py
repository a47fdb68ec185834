"""Asynchronous checkpoints: a snapshot of the step they were taken at, published only when
complete, the same resume as a synchronous run, and a crash mid-write loses nothing."""

import shutil

import pytest
import torch

from checkpoint_helpers import ENV, tiny_model_and_optimizer, train_a_step
from faults import faults_env
from train_helpers import assert_same_losses, metrics, run, run_in_process, tiny_overrides
from training import checkpoint
from training.checkpoint import CheckpointWriter


def test_an_async_checkpoint_holds_the_weights_of_its_step_not_later_ones(tmp_path):
    model, optimizer = tiny_model_and_optimizer()
    train_a_step(model, optimizer)
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    writer = CheckpointWriter(tmp_path, ENV, keep=2, asynchronous=True)
    writer.save(1, model, optimizer, {"step": 1}, {}, "")
    for _ in range(3):  # training goes on while the write is in flight
        train_a_step(model, optimizer)
    assert not checkpoint.complete_checkpoints(tmp_path) or writer.in_flight is None
    writer.wait()
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step_000001"]
    fresh, fresh_optimizer = tiny_model_and_optimizer()
    found = checkpoint.load_latest(tmp_path, fresh, fresh_optimizer, ENV)
    assert found.trainer_state == {"step": 1}
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, at_save[name]), name


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_trainers_checkpoint_component_writes_as_configured(tmp_path, asynchronous):
    """An asynchronous run publishes what a synchronous one does (tested below), so only the
    writer's settings can tell them apart."""
    from training.checkpoint.layout import CheckpointConfig
    from training.checkpoint.saving import Checkpointing

    settings = CheckpointConfig(every=7, keep=3, async_write=asynchronous)
    component = Checkpointing(settings, tmp_path, ENV)
    writer = component.writer
    assert (writer.run_dir, writer.keep, writer.asynchronous) == (tmp_path, 3, asynchronous)
    assert component.every == 7


@pytest.mark.slow
@pytest.mark.mutation
def test_async_checkpoints_train_and_resume_like_synchronous_ones(corpus, reference, tmp_path):
    overrides = tiny_overrides(corpus, tmp_path, **{"checkpoint.async_write": True})
    assert run_in_process(overrides) == 0
    published = checkpoint.complete_checkpoints(tmp_path)
    # the last step's save, in flight when the loop ended, was finished and published
    assert [p.name for p in published] == ["step_000008", "step_000012"]
    # each step logs how long it waited for the writer
    stalls = [m["checkpoint_stall_s"] for m in metrics(tmp_path) if "loss" in m]
    assert len(stalls) == 12 and all(isinstance(s, float) and s >= 0 for s in stalls)
    shutil.rmtree(published[-1])
    assert run_in_process(overrides) == 0  # resumes from the async checkpoint of step 8
    assert_same_losses(tmp_path, reference[1])


@pytest.mark.slow
def test_a_crash_during_an_async_save_leaves_the_previous_checkpoint(corpus, reference, tmp_path):
    overrides = tiny_overrides(
        corpus,
        tmp_path,
        **{"checkpoint.async_write": True},
    )
    code, output = run(overrides, env=faults_env(crash_in_checkpoint_at=8))
    assert code == 13, output[-3000:]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000004", "step_000008.tmp"]  # the write in flight never published
    code, output = run(overrides)
    assert code == 0 and "step_000004 at step 4" in output, output[-3000:]
    assert_same_losses(tmp_path, reference[1])
