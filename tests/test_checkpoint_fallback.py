"""A published checkpoint whose bytes are damaged is set aside, and the one before it resumes.

Each test saves checkpoints at steps 2 and 4 of a tiny model, damages step 4 the way a disk or a
person might, and resumes as the trainer does: ``checkpoint.load_latest``, then
``checkpoint.set_aside`` for each damaged checkpoint it reports (:func:`resume`).
"""

import importlib
import json
import logging
import pickle

import pytest
import torch

from checkpoint_helpers import (
    ENV,
    Payload,
    save_checkpoint,
    tiny_model_and_optimizer,
    train_a_step,
)
from model import Llama
from training import checkpoint
from training.runtime.distributed import Env


def save_steps_2_and_4(run_dir, env: Env = ENV) -> None:
    model, optimizer = tiny_model_and_optimizer()
    for step in (2, 4):
        train_a_step(model, optimizer)
        train_a_step(model, optimizer)
        data = {"batches": step}
        save_checkpoint(run_dir, step, model, optimizer, {"step": step}, data, "", env, keep=3)


def truncate_a_shard(path) -> None:
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def delete_the_rank_file(path) -> None:
    (path / "rank_00000.pt").unlink()


def garble_the_metadata(path) -> None:
    metadata = path / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:200])


def plant_code_in_the_metadata(path) -> None:
    (path / ".metadata").write_bytes(pickle.dumps(Payload(path.parent.parent / "marker")))


def resume(run_dir, model, optimizer, env: Env = ENV, **kwargs):
    """What ``Trainer._resume`` does with the checkpoints: load, then set the damaged aside."""
    found = checkpoint.load_latest(run_dir, model, optimizer, env, **kwargs)
    if found is not None:
        for damaged in found.damaged:
            checkpoint.set_aside(damaged, env)
    return found


def drop_the_manifest(path) -> None:
    """As a checkpoint written before manifests existed."""
    (path / "manifest.json").unlink()


def names(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


DAMAGE = [truncate_a_shard, delete_the_rank_file, garble_the_metadata, plant_code_in_the_metadata]


@pytest.mark.parametrize("manifest", [True, False], ids=["checksummed", "older"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one(
    tmp_path, damage, manifest, caplog
):
    save_steps_2_and_4(tmp_path)
    newest = tmp_path / "checkpoints" / "step_000004"
    if not manifest:
        drop_the_manifest(newest)
    damage(newest)
    model, optimizer = tiny_model_and_optimizer()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000002" and found.damaged == [newest]
    assert found.trainer_state["step"] == 2 and list(found.data_states) == [{"batches": 2}]
    assert names(tmp_path) == ["step_000002", "step_000004.corrupt"]
    assert "step_000004 cannot be loaded: " in caplog.text
    assert not (tmp_path / "marker").exists()


def flip_a_byte_of_a_shard(path) -> None:
    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_flipped_byte_is_damage_its_checksum_finds(tmp_path):
    """The same size, one byte different: only the checksum recorded at save time tells."""
    save_steps_2_and_4(tmp_path)
    flip_a_byte_of_a_shard(tmp_path / "checkpoints" / "step_000004")
    model, optimizer = tiny_model_and_optimizer()
    found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000002"
    assert names(tmp_path) == ["step_000002", "step_000004.corrupt"]


def test_a_checkpoint_without_a_manifest_loads_as_before(tmp_path):
    save_steps_2_and_4(tmp_path)
    for path in checkpoint.complete_checkpoints(tmp_path):
        drop_the_manifest(path)
    model, optimizer = tiny_model_and_optimizer()
    found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000004" and found.damaged == []


def test_the_manifest_lists_every_file_with_its_size(tmp_path):
    save_steps_2_and_4(tmp_path)
    path = tmp_path / "checkpoints" / "step_000004"
    files = json.loads((path / "manifest.json").read_text())["files"]
    on_disk = {p.name: p.stat().st_size for p in path.iterdir() if p.name != "manifest.json"}
    assert {name: entry["size"] for name, entry in files.items()} == on_disk
    assert {".metadata", "__0_0.distcp", "rank_00000.pt", "trainer.json"} <= set(files)


def test_a_damaged_checkpoint_is_found_before_a_byte_is_loaded_and_the_fallback_is_whole(
    tmp_path,
):
    save_steps_2_and_4(tmp_path)
    truncate_a_shard(tmp_path / "checkpoints" / "step_000004")
    model, optimizer = tiny_model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(checkpoint.DamagedCheckpointError, match="were written"):
        checkpoint.load(tmp_path / "checkpoints" / "step_000004", model, optimizer, ENV)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))

    resume(tmp_path, model, optimizer)
    reference, reference_optimizer = tiny_model_and_optimizer()
    checkpoint.load(tmp_path / "checkpoints" / "step_000002", reference, reference_optimizer, ENV)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    ours, theirs = optimizer.state_dict(), reference_optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)


def test_when_no_checkpoint_loads_it_says_why_for_each_and_renames_none(tmp_path):
    save_steps_2_and_4(tmp_path)
    truncate_a_shard(tmp_path / "checkpoints" / "step_000004")
    delete_the_rank_file(tmp_path / "checkpoints" / "step_000002")
    model, optimizer = tiny_model_and_optimizer()
    with pytest.raises(checkpoint.NoLoadableCheckpointError) as error:
        resume(tmp_path, model, optimizer)
    message = str(error.value)
    assert "none of its 2 checkpoints can be loaded; refusing to start over from step 0" in message
    assert "step_000004: DamagedCheckpointError:" in message and "were written" in message
    assert "step_000002: DamagedCheckpointError:" in message
    assert "rank_00000.pt is missing" in message
    # a requeued job must fail the same way, not find no checkpoint and start from step 0
    assert names(tmp_path) == ["step_000002", "step_000004"]


def test_a_run_without_checkpoints_starts_fresh(tmp_path):
    model, optimizer = tiny_model_and_optimizer()
    assert resume(tmp_path, model, optimizer) is None


@pytest.mark.slow
def test_another_world_size_loads_every_ranks_data_state(tmp_path):
    """Not a mismatch any more: the model and optimizer reshard through DCP, and the data state
    is every old rank's, for ``data.restore_loader`` to re-partition (tests/test_data_*)."""
    save_steps_2_and_4(tmp_path)
    for path in checkpoint.complete_checkpoints(tmp_path):  # as if 2 processes had written it
        extra = torch.load(path / "rank_00000.pt", weights_only=True)
        for rank in (0, 1):
            data = {**extra["data"], "rank": rank}
            torch.save({**extra, "data": data, "world_size": 2}, path / f"rank_{rank:05d}.pt")
        drop_the_manifest(path)  # the rank files were rewritten after it
    model, optimizer = tiny_model_and_optimizer()
    found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000004" and found.trainer_state["step"] == 4
    assert list(found.data_states) == [{"batches": 4, "rank": 0}, {"batches": 4, "rank": 1}]
    # every old rank's data state is needed: a checkpoint that lost one is damaged
    (found.path / "rank_00001.pt").unlink()
    found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000002" and found.data_states[1] == {"batches": 2, "rank": 1}
    assert names(tmp_path) == ["step_000002", "step_000004.corrupt"]


def test_a_resume_on_the_same_layout_reads_only_its_own_rank_file(tmp_path, monkeypatch):
    """256 ranks reading 256 rank files each would be 65,536 reads at every requeue. What the
    data pipeline needs (``data.needs_every_rank``) decides: its own stream's state on the same
    layout, every rank's (read up front, while the ranks agree) for a re-partition."""
    from types import SimpleNamespace

    from data import needs_every_rank

    loading = importlib.import_module("training.checkpoint.rank_files")
    save_steps_2_and_4(tmp_path)
    path = tmp_path / "checkpoints" / "step_000004"
    extra = torch.load(path / "rank_00000.pt", weights_only=True)
    for rank in (0, 1, 2):  # as if 3 processes, without DataLoader workers, had written it
        torch.save({**extra, "data": {"rank": rank}, "world_size": 3}, path / f"rank_{rank:05d}.pt")
    read = []
    real = loading.load_weights_only
    monkeypatch.setattr(
        loading, "load_weights_only", lambda f, *a: read.append(f.name) or real(f, *a)
    )
    rank_1_of_3 = Env(rank=1, world_size=3, local_rank=0, device=torch.device("cpu"))

    def rank_files(world_size: int, workers: int):
        loader = SimpleNamespace(
            dataset=SimpleNamespace(world_size=world_size), num_workers=workers
        )
        read.clear()
        return loading.read_rank_files(
            path, rank_1_of_3, lambda n, own: needs_every_rank(loader, n, own)
        )

    rng, every_rank = rank_files(3, 0)  # the same streams
    assert rng is not None and read == ["rank_00001.pt"]
    assert len(every_rank) == 3 and every_rank[1] == {"rank": 1} and read == ["rank_00001.pt"]
    assert every_rank[-3] == {"rank": 0} and read == ["rank_00001.pt", "rank_00000.pt"]
    # another data.num_workers: every file up front, each checked
    _, every_rank = rank_files(3, 2)
    assert sorted(read) == ["rank_00000.pt", "rank_00001.pt", "rank_00002.pt"]
    assert list(every_rank) == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    torch.save({**extra, "data": {}, "world_size": 2}, path / "rank_00002.pt")
    with pytest.raises(
        checkpoint.DamagedCheckpointError, match=r"rank_00002\.pt says 2 processes wrote"
    ):
        rank_files(3, 2)
    # a missing file is damage found up front, whichever files this rank would read
    (path / "rank_00002.pt").unlink()
    with pytest.raises(checkpoint.DamagedCheckpointError, match=r"rank_00002\.pt is missing"):
        rank_files(3, 0)
    # another world size (written by 2, read by 3): every file up front
    for rank in (0, 1):
        torch.save({**extra, "data": {"rank": rank}, "world_size": 2}, path / f"rank_{rank:05d}.pt")
    _, every_rank = rank_files(3, 0)
    assert sorted(read) == ["rank_00000.pt", "rank_00001.pt"]
    assert list(every_rank) == [{"rank": 0}, {"rank": 1}]


def two_ranks_resume(rank: int, run_dir: str) -> None:
    """One of two gloo processes: save, lose rank 1's file of step 4, resume."""
    from pathlib import Path

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{run_dir}/rendezvous", rank=rank, world_size=2
    )
    env = Env(rank=rank, world_size=2, local_rank=0, device=torch.device("cpu"))
    save_steps_2_and_4(Path(run_dir), env)
    if rank == 0:
        (Path(run_dir) / "checkpoints" / "step_000004" / "rank_00001.pt").unlink()
    dist.barrier()
    model, optimizer = tiny_model_and_optimizer()
    found = resume(run_dir, model, optimizer, env)
    result = {
        "path": found.path.name,
        "step": found.trainer_state["step"],
        "data": list(found.data_states),
    }
    (Path(run_dir) / f"result_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_falls_back_when_one_rank_lost_its_file(tmp_path):
    torch.multiprocessing.spawn(two_ranks_resume, args=(str(tmp_path),), nprocs=2)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"result_{rank}.json").read_text())
        assert result == {"path": "step_000002", "step": 2, "data": [{"batches": 2}] * 2}
    assert names(tmp_path) == ["step_000002", "step_000004.corrupt"]


def test_evaluation_skips_a_damaged_newest_checkpoint_and_leaves_it_in_place(tmp_path, caplog):
    from data import load_tokenizer
    from train_helpers import compose, tiny_overrides
    from training.checkpoint import load_trained_model

    config, config_yaml = compose(tiny_overrides(tmp_path / "corpus", tmp_path))
    (tmp_path / "config.yaml").write_text(config_yaml)
    vocab = load_tokenizer(config.data.tokenizer).vocab_size
    model = Llama(config.model.with_vocab_from_tokenizer(vocab))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in (2, 4):
        save_checkpoint(tmp_path, step, model, optimizer, {"step": step}, {}, config_yaml, ENV, 3)
    plant_code_in_the_metadata(tmp_path / "checkpoints" / "step_000004")

    with caplog.at_level(logging.WARNING, logger="training.checkpoint.runs"):
        _, _, step = load_trained_model(tmp_path)
    assert step == 2 and "skipping" in caplog.text and "step_000004" in caplog.text
    assert names(tmp_path) == ["step_000002", "step_000004"]  # eval only reads
    with pytest.raises(checkpoint.DamagedCheckpointError, match=r"\.metadata has \d+ bytes"):
        load_trained_model(tmp_path, step=4)
    drop_the_manifest(tmp_path / "checkpoints" / "step_000004")  # as an older checkpoint
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle"):
        load_trained_model(tmp_path, step=4)
    assert not (tmp_path / "marker").exists()


LOADING = importlib.import_module("training.checkpoint.load")  # the package exports load()


def reads_failing_with_eio(monkeypatch, fails) -> list[str]:
    """DCP reads that raise EIO where ``fails(path, earlier calls)`` says so; no backoff
    sleeps. Returns the list the reads' checkpoint names are appended to."""
    import errno

    monkeypatch.setattr(LOADING.time, "sleep", lambda s: None)
    real, calls = LOADING.dcp_load, []

    def read(state, path):
        calls.append(path.name)
        if fails(path, len(calls)):
            raise OSError(errno.EIO, "Input/output error", str(path / "__0_0.distcp"))
        return real(state, path)

    monkeypatch.setattr(LOADING, "dcp_load", read)
    return calls


def test_a_passing_io_error_is_retried_before_the_checkpoint_counts_as_damaged(
    tmp_path, monkeypatch, caplog
):
    """An NFS/Lustre hiccup (EIO) while reading the newest checkpoint used to rename a good
    checkpoint .corrupt and resume from the one before."""
    save_steps_2_and_4(tmp_path)
    calls = reads_failing_with_eio(monkeypatch, lambda path, n: n <= 2)  # the third read works
    model, optimizer = tiny_model_and_optimizer()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000004" and found.trainer_state["step"] == 4
    assert calls == ["step_000004"] * 3
    assert names(tmp_path) == ["step_000002", "step_000004"]
    assert "I/O error" in caplog.text and "trying again" in caplog.text


def test_an_io_error_that_does_not_pass_falls_back_after_the_retries(tmp_path, monkeypatch):
    save_steps_2_and_4(tmp_path)
    calls = reads_failing_with_eio(monkeypatch, lambda path, n: path.name == "step_000004")
    model, optimizer = tiny_model_and_optimizer()
    found = resume(tmp_path, model, optimizer)
    assert found.path.name == "step_000002"
    assert calls == ["step_000004"] * (1 + LOADING.IO_RETRIES) + ["step_000002"]
    assert names(tmp_path) == ["step_000002", "step_000004.corrupt"]


@pytest.mark.slow
@pytest.mark.mutation
def test_the_trainer_sets_a_damaged_newest_checkpoint_aside_and_resumes_the_one_before(
    corpus, reference, tmp_path, caplog
):
    """The trainer's own resume (``training.checkpoint.saving``), not this file's ``resume``."""
    import shutil

    from train_helpers import assert_same_losses, run_in_process, tiny_overrides

    run_dir = shutil.copytree(reference[0], tmp_path / "run")
    truncate_a_shard(run_dir / "checkpoints" / "step_000012")
    with caplog.at_level(logging.INFO, logger="training.checkpoint.saving"):
        assert run_in_process(tiny_overrides(corpus, run_dir)) == 0
    assert names(run_dir) == ["step_000008", "step_000012", "step_000012.corrupt"]
    assert f"resumed from {run_dir}/checkpoints/step_000008 at step 8" in caplog.text
    assert_same_losses(run_dir, reference[1])


def _older_checkpoint_without(path, key: str) -> None:
    """As an older layout might: no manifest, and ``key`` missing from ``trainer.json``."""
    drop_the_manifest(path)
    state = json.loads((path / "trainer.json").read_text())
    del state[key]
    (path / "trainer.json").write_text(json.dumps(state))


@pytest.mark.slow
def test_an_older_checkpoint_that_records_no_step_is_damage_and_the_one_before_resumes(
    corpus, reference, tmp_path
):
    """It stopped every resume with a KeyError; a step is the one thing a resume cannot do
    without, so its absence is evidence the file is not what was written."""
    import shutil

    from train_helpers import assert_same_losses, run_in_process, tiny_overrides

    run_dir = shutil.copytree(reference[0], tmp_path / "run")
    _older_checkpoint_without(run_dir / "checkpoints" / "step_000012", "step")
    assert run_in_process(tiny_overrides(corpus, run_dir)) == 0
    assert names(run_dir) == ["step_000008", "step_000012", "step_000012.corrupt"]
    assert_same_losses(run_dir, reference[1])


@pytest.mark.slow
def test_an_older_checkpoint_that_records_no_token_count_resumes_with_the_step_s_count(
    corpus, reference, tmp_path
):
    """The tokens consumed before a step are a function of the step (``BatchPlan``): 12 steps
    of 4 x 32 tokens."""
    import shutil

    from train_helpers import metrics, run_in_process, tiny_overrides

    run_dir = shutil.copytree(reference[0], tmp_path / "run")
    _older_checkpoint_without(run_dir / "checkpoints" / "step_000012", "tokens")
    assert run_in_process([*tiny_overrides(corpus, run_dir), "trainer.steps=14"]) == 0
    last = [m for m in metrics(run_dir) if "tokens" in m][-1]
    assert (last["step"], last["tokens"]) == (14, 14 * 4 * 32)
