"""A checkpoint is data: loading one runs no code, whichever of its pickles was tampered with.

Each test plants a pickle whose unpickling would create a marker file (``os.system``), shows
that plain unpickling of the planted file really runs it (the control), then that our loading
refuses it with an error naming the file and what was refused, and that the marker never
appears. Whoever can plant a file can rewrite the checkpoint's manifest too, so the planted
checkpoints here have none: the checksums find damage, the unpickler is what keeps code out.
"""

import os
import pickle
import random
import re
import shutil

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from checkpoint_helpers import (
    ENV,
    Payload,
    save_checkpoint,
    tiny_model_and_optimizer,
    train_a_step,
)
from training import checkpoint
from training.errors import UnsafeCheckpointError

SYSTEM = rf"{os.system.__module__}\.system"  # posix.system on Linux


DATA_STATE = {"_snapshot": {"pending": {"stream": 0, "packer": {"buffer": torch.arange(5)}}}}


@pytest.fixture
def saved(tmp_path):
    """A run directory with one checkpoint at step 2, and the model and optimizer it holds."""
    model, optimizer = tiny_model_and_optimizer()
    train_a_step(model, optimizer)
    train_a_step(model, optimizer)
    path = save_checkpoint(tmp_path, 2, model, optimizer, {"step": 2}, DATA_STATE, "", ENV, 2)
    return path, model, optimizer


def test_a_normal_checkpoint_round_trips_exactly_with_every_rng(saved):
    path, model, optimizer = saved
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    np.random.standard_normal()  # numpy now holds a cached gaussian: part of its state
    save_checkpoint(path.parent.parent, 3, model, optimizer, {"step": 3}, DATA_STATE, "", ENV, 2)
    expected = (torch.rand(3), random.random(), np.random.standard_normal(2))
    fresh, fresh_optimizer = tiny_model_and_optimizer()
    loaded = checkpoint.load(path.with_name("step_000003"), fresh, fresh_optimizer, ENV)
    (data_state,) = loaded.data_states
    assert loaded.trainer_state == {"step": 3} and loaded.changed_settings == []
    assert torch.equal(data_state["_snapshot"]["pending"]["packer"]["buffer"], torch.arange(5))
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    ours, theirs = fresh_optimizer.state_dict(), optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for index, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)
    got = (torch.rand(3), random.random(), np.random.standard_normal(2))
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
    assert np.array_equal(got[2], expected[2])


def test_a_payload_in_a_rank_file_is_refused_naming_the_file(saved, tmp_path):
    path, model, optimizer = saved
    rank_file = path / "rank_00000.pt"
    extra = torch.load(rank_file, weights_only=True)
    torch.save({**extra, "data": Payload(tmp_path / "control")}, rank_file)
    torch.load(rank_file, weights_only=False)  # the control: plain unpickling runs it
    assert (tmp_path / "control").exists()

    torch.save({**extra, "data": Payload(tmp_path / "marker")}, rank_file)
    (path / "manifest.json").unlink()
    message = rf"refusing to unpickle {SYSTEM} from {re.escape(str(rank_file))}: a checkpoint"
    with pytest.raises(UnsafeCheckpointError, match=message):
        checkpoint.load(path, model, optimizer, ENV)
    assert not (tmp_path / "marker").exists()


def test_a_payload_as_dcp_metadata_is_refused_naming_the_file(saved, tmp_path):
    path, model, optimizer = saved
    control = shutil.copytree(path, tmp_path / "control_checkpoint")
    (control / ".metadata").write_bytes(pickle.dumps(Payload(tmp_path / "control")))
    with pytest.raises(CheckpointException), checkpoint.single_process_is_intended():
        # DCP's own reader runs it, then fails on what it returned (os.system's exit code)
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(control))
    assert (tmp_path / "control").exists()

    (path / ".metadata").write_bytes(pickle.dumps(Payload(tmp_path / "marker")))
    (path / "manifest.json").unlink()
    metadata = re.escape(str(path / ".metadata"))
    message = rf"refusing to unpickle {SYSTEM} from {metadata}: a checkpoint's metadata"
    with pytest.raises(UnsafeCheckpointError, match=message):
        checkpoint.load(path, model, optimizer, ENV)
    assert not (tmp_path / "marker").exists()


def test_a_payload_among_dcp_values_in_a_shard_is_refused_naming_the_file(tmp_path):
    """DCP pickles non-tensor values (the optimizer's lr, betas, ...) into its .distcp shards
    and its default planner unpickles them with weights_only=False."""
    model, optimizer = tiny_model_and_optimizer()
    train_a_step(model, optimizer)
    optimizer.param_groups[0]["lr"] = Payload(tmp_path / "marker")
    path = save_checkpoint(tmp_path / "run", 1, model, optimizer, {"step": 1}, {}, "", ENV, 2)
    control = shutil.copytree(path, tmp_path / "control_checkpoint")
    state = {"optim.param_groups.embed_tokens.weight.lr": 0.0}
    with checkpoint.single_process_is_intended():
        dcp.load(state, checkpoint_id=str(control))  # the control: DCP's planner runs it
    assert (tmp_path / "marker").exists()
    (tmp_path / "marker").unlink()

    fresh, fresh_optimizer = tiny_model_and_optimizer()
    message = (
        rf"refusing to unpickle {SYSTEM} from {re.escape(str(path))}/__0_0\.distcp "
        r"\(the value of optim\.param_groups\.[\w.]+\.lr\)"
    )
    with pytest.raises(UnsafeCheckpointError, match=message):
        checkpoint.load(path, fresh, fresh_optimizer, ENV)
    assert not (tmp_path / "marker").exists()


def test_dcp_values_may_only_be_plain_python_values(tmp_path):
    """Weights-only unpickling builds a torch.device, say; a param-group value is never one."""
    model, optimizer = tiny_model_and_optimizer()
    train_a_step(model, optimizer)
    optimizer.param_groups[1]["betas"] = torch.device("cpu")
    path = save_checkpoint(tmp_path, 1, model, optimizer, {"step": 1}, {}, "", ENV, 2)
    fresh, fresh_optimizer = tiny_model_and_optimizer()
    with pytest.raises(
        UnsafeCheckpointError,
        match=r"refusing to unpickle torch\.device .*optim\.param_groups\.[\w.]+\.betas",
    ):
        checkpoint.load(path, fresh, fresh_optimizer, ENV)
