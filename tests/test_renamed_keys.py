"""Settings that moved to their sections: an old key is refused naming its new place, and a run
directory written before the move resumes.

The old layout is written out here (``OLD_PLACES``: the trainer's flat bag, the loss's and the
optimizers' knobs in ``optim``), not read from ``training.renamed_keys``, so that a table that
loses or misplaces a key fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from dataclasses import fields

import pytest
import yaml

from train_helpers import ROOT, compose, losses, run_in_process, tiny_overrides
from training.config import ExperimentConfig, config_value
from training.errors import ConfigError
from training.renamed_keys import RENAMED, refuse_renamed, upgrade

# new key -> where it was before the settings moved to their sections
OLD_PLACES = {
    "parallel.strategy": "trainer.parallelism",
    "parallel.precision": "trainer.precision",
    "parallel.compile": "trainer.compile",
    "parallel.compile_backend": "trainer.compile_backend",
    "parallel.activation_checkpointing": "trainer.activation_checkpointing",
    "parallel.float8": "trainer.float8",
    "parallel.float8_keep": "trainer.float8_keep",
    "parallel.float8_auto_filter": "trainer.float8_auto_filter",
    "parallel.fsdp_reshard_after_forward": "trainer.fsdp_reshard_after_forward",
    "parallel.fsdp_reduce_every_micro_batch": "trainer.fsdp_reduce_every_micro_batch",
    "parallel.collective_timeout_s": "trainer.collective_timeout_s",
    "checkpoint.every": "trainer.checkpoint_every",
    "checkpoint.async_write": "trainer.async_checkpoint",
    "checkpoint.keep": "trainer.keep_checkpoints",
    "validation.every": "trainer.eval_every",
    "validation.batches": "trainer.eval_batches",
    "downstream.every": "trainer.downstream_every",
    "downstream.tasks": "trainer.downstream_tasks",
    "downstream.limit": "trainer.downstream_limit",
    "downstream.data": "trainer.downstream_data",
    "spikes.window": "trainer.spike_window",
    "spikes.threshold": "trainer.spike_threshold",
    "spikes.skip": "trainer.spike_skip",
    "spikes.skip_limit": "trainer.spike_skip_limit",
    "spikes.max_bad_steps": "trainer.max_bad_steps",
    "profile.steps": "trainer.profile_steps",
    "loss.z_loss": "optim.z_loss",
    "loss.goldfish_k": "optim.goldfish_k",
    "loss.goldfish_h": "optim.goldfish_h",
    "loss.goldfish_rule": "optim.goldfish_rule",
    "loss.eod_mask": "optim.eod_mask_loss",
    "optim.ademamix.alpha": "optim.ademamix_alpha",
    "optim.ademamix.beta3": "optim.ademamix_beta3",
    "optim.ademamix.alpha_warmup": "optim.ademamix_alpha_warmup",
    "optim.ademamix.beta3_warmup": "optim.ademamix_beta3_warmup",
    "optim.muon.lr": "optim.muon_lr",
    "optim.muon.momentum": "optim.muon_momentum",
}
MOVED_SECTIONS = ("parallel", "checkpoint", "validation", "downstream", "spikes", "profile", "loss")
# keys these sections gained after the move: no old place, and a run of the old layout never
# wrote them (the upgrade leaves them at their defaults)
ADDED_SINCE = {"checkpoint.initial_hf"}


def test_the_table_moves_every_old_key_to_the_place_written_here():
    moved = {new: old for old, new in RENAMED.items() if old != "data.document_ids"}
    assert moved == OLD_PLACES


def test_every_key_of_a_moved_section_has_its_old_place_and_no_old_key_is_still_a_key():
    default = ExperimentConfig()
    for section in MOVED_SECTIONS:
        for f in fields(getattr(default, section)):
            key = f"{section}.{f.name}"
            assert key in OLD_PLACES or key in ADDED_SINCE, f"{key} has no old place"
    for new, old in OLD_PLACES.items():
        config_value(default, new)  # the new place exists
        with pytest.raises(ConfigError, match=rf"^{old} is now {new}: "):
            config_value(default, old)


@pytest.mark.parametrize(
    "override", ["trainer.float8=rowwise", "+optim.muon_lr=0.01", "~optim.z_loss"]
)
def test_an_old_key_on_the_command_line_is_refused_naming_its_new_place(override):
    key = override.lstrip("+~").split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key} is now {OLD_PLACES_INVERSE[key]}: "):
        refuse_renamed(["activation=relu2", override])
    refuse_renamed(["parallel.float8=rowwise", "optim.muon.lr=0.01", "trainer.steps=3"])


OLD_PLACES_INVERSE = {old: new for new, old in OLD_PLACES.items()}


def test_train_py_refuses_an_old_key_before_anything_is_composed_or_written(tmp_path):
    """What a user who typed the old key sees: one line, the new key, exit code 1."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "trainer.eval_every=5", "trainer.steps=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "invalid configuration: trainer.eval_every is now validation.every" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_with_an_old_key_is_refused_before_any_job():
    from training import sweeps

    sweep = {
        "grids": [{"overrides": ["experiment=quickstart"], "sweep": {"optim.muon_lr": [0.01]}}]
    }
    with pytest.raises(ConfigError, match=r"^optim\.muon_lr is now optim\.muon\.lr"):
        sweeps.expand(sweep)


def in_old_layout(saved: dict) -> dict:
    """A saved config.yaml as the trainer wrote it before the settings moved: every key of
    OLD_PLACES back in its old place, compile and checkpointing as the booleans they once were
    (``compile: false``), the axes naming old keys."""
    import copy

    old = copy.deepcopy(saved)
    for new, was in OLD_PLACES.items():
        *parents, leaf = new.split(".")
        node = old
        for part in parents:
            node = node[part]
        value = node.pop(leaf)
        section, name = was.split(".")
        old.setdefault(section, {})[name] = value
    for new in ADDED_SINCE:
        section, leaf = new.split(".")
        old[section].pop(leaf)
    for section in (*MOVED_SECTIONS, "optim.ademamix", "optim.muon"):
        *parents, leaf = section.split(".")
        node = old
        for part in parents:
            node = node[part]
        assert node.pop(leaf) == {}, f"{section}: a key the table forgot"
    old["trainer"]["compile"] = old["trainer"]["compile"] != "none"
    old["trainer"]["activation_checkpointing"] = (
        old["trainer"]["activation_checkpointing"] != "none"
    )
    old["trainer"]["axes"] = [OLD_PLACES.get(key, key) for key in old["trainer"]["axes"]]
    return old


def test_a_saved_config_in_the_old_layout_reads_as_the_run_that_wrote_it():
    _, text = compose(
        [
            "optim.name=muon",
            "optim.muon.lr=0.03",
            "loss.goldfish_k=7",
            "validation.every=9",
            "parallel.activation_checkpointing=full",
            "trainer.axes=[optim.muon.lr]",
        ]
    )
    saved = yaml.safe_load(text)
    old = in_old_layout(saved)
    assert old["optim"]["muon_lr"] == 0.03 and old["trainer"]["activation_checkpointing"] is True
    for new in ADDED_SINCE:  # at its default, which the schema fills in when the file is read
        section, leaf = new.split(".")
        assert saved[section].pop(leaf) is None
    assert upgrade(old) == saved


@pytest.mark.slow
def test_a_run_directory_written_in_the_old_layout_resumes_and_reads(corpus, tmp_path):
    """A run stopped at step 6, its run directory's and checkpoint's config.yaml rewritten in
    the old layout, as a run of the previous version left them: rerunning the command resumes
    it at step 6 (the resume rules compare against the old file, read through the table), the
    losses continue those of a run that was never stopped, and evaluation reads the run."""
    from faults import fault_components
    from training.checkpoint import load_trained_model

    run_dir, whole_dir = tmp_path / "run", tmp_path / "whole"
    settings = {"checkpoint.every": 100, "loss.goldfish_k": 3, "loss.goldfish_h": 5}
    settings["optim.name"] = "ademamix"
    assert run_in_process(tiny_overrides(corpus, whole_dir, **settings)) == 0
    stop = fault_components(signal="SIGTERM@6")  # checkpointed at the stop, exit 75
    assert run_in_process(tiny_overrides(corpus, run_dir, **settings), stop) == 75
    written = [run_dir / "config.yaml", *run_dir.glob("checkpoints/step_*/config.yaml")]
    assert len(written) == 2
    for path in written:
        path.write_text(yaml.safe_dump(in_old_layout(yaml.safe_load(path.read_text()))))
    # the checkpoint's manifest as the old trainer wrote it: its config.yaml's size and CRC-32
    manifest_file = written[1].parent / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    data = written[1].read_bytes()
    manifest["files"]["config.yaml"] = {"size": len(data), "crc32": zlib.crc32(data)}
    manifest_file.write_text(json.dumps(manifest))
    old = yaml.safe_load(written[1].read_text())
    assert old["optim"]["goldfish_k"] == 3 and "loss" not in old

    assert run_in_process(tiny_overrides(corpus, run_dir, **settings)) == 0
    resumed, whole = losses(run_dir), losses(whole_dir)
    assert sorted(resumed) == list(range(1, 13))
    assert [resumed[s] for s in range(7, 13)] == pytest.approx([whole[s] for s in range(7, 13)])
    _, config, step = load_trained_model(run_dir)
    assert step == 12 and config.loss.goldfish_k == 3
