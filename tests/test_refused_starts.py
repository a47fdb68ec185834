"""A refused start changes nothing: the run directory is byte for byte what it was.

A finished tiny run is restarted with each mistake a user makes (another width, other data, a
glob that matches nothing, another learning rate, a batch that does not divide); each start is
refused, naming the key with the run's value and the new one, and a snapshot of the directory
(names, sizes, hashes) taken before equals the one taken after. Readers of the run then still
see the run that was trained.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from train_helpers import (
    ROOT,
    compose,
    metrics,
    run,
    run_in_process,
    snapshot,
    tiny_overrides,
)
from training.checkpoint import load_trained_model, run_config
from training.errors import IncompatibleCheckpointError
from training.resume_rules import FIXED_SECTIONS, MAY_CHANGE


def base(corpus: Path, run_dir: Path, **extra) -> list[str]:
    values = {
        "trainer.steps": 4,
        "schedule.warmup_steps": 1,
        "schedule.decay_steps": 1,
        "checkpoint.every": 2,
        "checkpoint.keep": 3,
        "validation.every": 2,
        **extra,
    }
    return tiny_overrides(corpus, run_dir, **values)


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert run_in_process(base(corpus, run_dir)) == 0
    return run_dir


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def other_corpus(corpus: Path, tmp_path: Path) -> Path:
    """The same kind of files, one fewer: another slice of text."""
    other = tmp_path / "other_corpus"
    other.mkdir()
    for file in sorted(corpus.glob("*.parquet"))[:-1]:
        shutil.copy(file, other)
    return other


@pytest.mark.slow
@pytest.mark.mutation
@pytest.mark.parametrize(
    "case",
    [
        "wider",
        "other data",
        "a glob that matches nothing",
        "another lr",
        "a batch that does not divide",
    ],
)
def test_a_refused_resume_leaves_the_run_directory_byte_for_byte(corpus, copy, tmp_path, case):
    overrides = base(corpus, copy)
    change, message = {
        "wider": (["model.dim=64"], r"model\.dim: 32 in the run, 64 now"),
        "other data": (
            [f"data.paths=[{other_corpus(corpus, tmp_path)}/*.parquet]"],
            r"data\.paths: \[.*\] in the run, \[.*other_corpus.*\] now",
        ),
        "a glob that matches nothing": (
            [f"data.paths=[{tmp_path}/nothing/*.parquet]"],
            r"data\.paths pattern .*nothing/\*\.parquet' matches no",
        ),
        "another lr": (["optim.lr=0.004"], r"optim\.lr: 0\.002 in the run, 0\.004 now"),
        "a batch that does not divide": (
            ["trainer.global_batch=5"],
            r"trainer\.global_batch=5 is not divisible",
        ),
    }[case]
    before = snapshot(copy)
    with pytest.raises(ValueError, match=message):
        run_in_process([*overrides, *change])
    assert snapshot(copy) == before
    # the readers still see the run that was trained
    assert run_config(copy).model.dim == 32
    _, config, step = load_trained_model(copy)
    assert step == 4 and config.model.dim == 32


@pytest.mark.slow
def test_an_intact_checkpoint_that_does_not_load_is_refused_and_nothing_set_aside(corpus, copy):
    """``allow_changes`` lets a fixed key through the config check; the load still refuses."""
    overrides = base(corpus, copy, **{"model.dim": 64, "trainer.allow_changes": "[model.dim]"})
    before = snapshot(copy)
    message = r"step_000004 is intact .*[Ss]ize mismatch"
    with pytest.raises(IncompatibleCheckpointError, match=message):
        run_in_process(overrides)
    assert snapshot(copy) == before


@pytest.mark.slow
def test_a_refused_fresh_start_writes_nothing(corpus, tmp_path):
    run_dir = tmp_path / "fresh"
    with pytest.raises(ValueError, match=r"data\.paths pattern"):
        run_in_process(base(corpus, run_dir, **{"data.paths": f"[{tmp_path}/none/*.jsonl]"}))
    assert not run_dir.exists()


@pytest.mark.slow
@pytest.mark.mutation
def test_what_a_resume_may_change_it_changes_and_the_run_goes_on(corpus, copy, caplog):
    overrides = base(corpus, copy)
    more = ["trainer.steps=6", "optim.weight_decay=0.05", "model.loss_chunk_tokens=16"]
    with caplog.at_level("WARNING", logger="training.checkpoint.saving"):
        assert run_in_process([*overrides, *more]) == 0
    assert max(m["step"] for m in metrics(copy)) == 6
    changed = [r.getMessage() for r in caplog.records if "optimizer setting" in r.getMessage()]
    assert len(changed) == 1 and "weight_decay 0.1 -> 0.05 for" in changed[0]
    assert run_config(copy).trainer.steps == 6  # the newest checkpoint's config


@pytest.mark.slow
def test_train_py_says_what_differs_in_one_message_without_a_traceback(corpus, copy):
    code, output = run([*base(corpus, copy), "model.dim=64", "model.n_layers=3"])
    assert code == 1
    assert "model.dim: 32 in the run, 64 now" in output
    assert "model.n_layers: 2 in the run, 3 now" in output
    assert "trainer.allow_changes=[model.dim,model.n_layers]" in output
    assert "Traceback" not in output
    config, _ = compose(base(corpus, copy))
    assert run_config(copy).model == config.model


@pytest.mark.slow
def test_train_py_refuses_a_non_finite_setting_and_leaves_no_directory(corpus, tmp_path):
    """Hydra made ``hydra.run.dir`` (the run directory) before the config was checked: a
    refused start on a new run directory left it there, empty."""
    run_dir = tmp_path / "fresh"
    code, output = run(base(corpus, run_dir, **{"optim.lr": "inf"}))
    assert code == 1
    assert "invalid configuration: optim.lr must be a finite number, got inf" in output
    assert "Traceback" not in output
    assert not run_dir.exists()


def _jsonl(path: Path, texts: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, texts, message",
    [
        ("an empty file", [], r"no training document"),
        ("every document held out", ["a document of words. " * 20] * 8, r"validation_documents=8"),
        ("no record with text", [None, 5, "  "] * 60, r"bad_records.: 120"),
    ],
)
def test_data_that_cannot_feed_a_step_is_refused_before_any_write(tmp_path, case, texts, message):
    """Found once the trainer draws its first batch, which it does before it writes anything;
    the refusal names the data setting and what the pipeline counted."""
    data = _jsonl(tmp_path / "data" / "part.jsonl", texts)
    run_dir = tmp_path / "run"
    overrides = base(tmp_path, run_dir, **{"data.paths": f"[{data}]"})
    with pytest.raises(ValueError, match=rf"data\.paths.*{message}|{message}.*data\.paths"):
        run_in_process(overrides)
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_corpus_whose_files_changed_since_the_checkpoint_is_refused_naming_them(corpus, tmp_path):
    """A glob that now matches another file (one added, or shards replaced in the folder the
    run reads) would shift every stream's position: refused, saying which file changed."""
    data = Path(shutil.copytree(corpus, tmp_path / "data"))
    run_dir = tmp_path / "run"
    overrides = base(corpus, run_dir, **{"data.paths": f"[{data}/*.parquet]"})
    assert run_in_process(overrides) == 0
    shutil.copy(data / "part_000.parquet", data / "part_003.parquet")
    before = snapshot(run_dir)
    more = [*overrides, "trainer.steps=6"]
    with pytest.raises(ValueError, match=r"added part_003\.parquet .*trainer\.run_dir"):
        run_in_process(more)
    assert snapshot(run_dir) == before
    (data / "part_003.parquet").unlink()
    assert run_in_process(more) == 0


def test_the_documented_list_is_the_one_the_refusal_follows():
    text = (ROOT / "docs" / "training.md").read_text()
    table = text.split("### What a resume may change")[1].split("\n## ")[0]
    exceptions = set()
    for section in FIXED_SECTIONS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{section}.*`"))
        exceptions |= set(re.findall(r"`([\w.]+)`", row.split("|")[1])) - {f"{section}.*"}
    assert exceptions == set(MAY_CHANGE)


@pytest.mark.parametrize("recorded", ["nothing", "an empty file", "this run's config"])
def test_a_checkpoint_with_nothing_else_recorded_is_not_refused(tmp_path, recorded):
    """Only a recorded config that differs refuses a resume: a checkpoint without one (or with
    an empty one) has nothing to compare with."""
    from training.checkpoint.saving import refuse_changes_since

    config, config_yaml = compose(tiny_overrides(tmp_path, tmp_path / "run"))
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000004"
    checkpoint.mkdir(parents=True)
    text = {"nothing": None, "an empty file": "", "this run's config": config_yaml}[recorded]
    if text is not None:
        (checkpoint / "config.yaml").write_text(text)
    refuse_changes_since(config, checkpoint)


def test_a_recorded_config_that_differs_or_cannot_be_read_is_refused_naming_the_file(tmp_path):
    from training.checkpoint.saving import refuse_changes_since
    from training.errors import ConfigError

    config, config_yaml = compose(tiny_overrides(tmp_path, tmp_path / "run"))
    wider, _ = compose([*tiny_overrides(tmp_path, tmp_path / "run"), "model.dim=64"])
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000004"
    checkpoint.mkdir(parents=True)
    where = checkpoint / "config.yaml"
    where.write_text(config_yaml)
    with pytest.raises(ConfigError, match=r"model\.dim: 32 in the run, 64 now"):
        refuse_changes_since(wider, checkpoint)
    where.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(where))} cannot be read to compare"):
        refuse_changes_since(config, checkpoint)
