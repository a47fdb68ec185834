"""``python -m eval.fetch_benchmarks DIR`` writes the Hub's datasets back into the published
layouts, and what reads such a directory refuses one that is missing, naming the command.

The Hub is stood in for by datasets built here in the Hub's layouts (``tests/hf_layouts.py``,
from the tests' own benchmark files), keyed by the dataset and configuration lm-eval's own task
YAMLs name: a writer that asked for another dataset would find nothing. The truth the written
directory is held to: the local suite built from it is, file for file, the one built from the
benchmark files the Hub's datasets were made from.
"""

import shutil
from pathlib import Path

import pytest

from benchmark_fixtures import write_benchmarks
from eval.benchmark_records import BENCHMARK_FOLDERS
from eval.fetch_benchmarks import fetch, main
from eval.local_tasks import build_local_tasks
from hf_layouts import Hub, hub


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    return write_benchmarks(tmp_path_factory.mktemp("published"))


def suite_files(source: Path, out: Path) -> dict[str, str]:
    """The local suite's files built from ``source``, by name, its own path taken out."""
    build_local_tasks(source, out)
    return {p.name: p.read_text().replace(str(out), "OUT") for p in sorted(out.iterdir())}


def test_the_suite_built_from_a_fetched_directory_is_the_one_built_from_the_published_files(
    published, tmp_path
):
    hub_ = Hub(hub(published))
    done = fetch(tmp_path / "fetched", load=hub_)
    assert done == dict.fromkeys(BENCHMARK_FOLDERS, "written")
    assert set(hub_.asked) == set(hub_.datasets)  # every split lm-eval's tasks read
    expected = suite_files(published, tmp_path / "from_published")
    got = suite_files(tmp_path / "fetched", tmp_path / "from_fetched")
    assert sum(name.endswith(".yaml") for name in expected) == 11  # the paper's suite, ARC twice
    assert got == expected
    assert sorted(p.name for p in (tmp_path / "fetched").iterdir()) == sorted(BENCHMARK_FOLDERS)


def test_a_benchmark_in_place_is_kept_unless_overwritten_and_only_names_folders(
    published, tmp_path
):
    hub_ = Hub(hub(published))
    assert fetch(tmp_path, only=["piqa", "gsm8k"], load=hub_) == {
        "piqa": "written",
        "gsm8k": "written",
    }
    assert {path for path, _, _ in hub_.asked} == {"baber/piqa", "openai/gsm8k"}
    (tmp_path / "gsm8k" / "test.jsonl").write_text("")
    assert fetch(tmp_path, only=["gsm8k"], load=hub_) == {"gsm8k": "kept"}
    assert (tmp_path / "gsm8k" / "test.jsonl").read_text() == ""
    assert fetch(tmp_path, only=["gsm8k"], overwrite=True, load=hub_) == {"gsm8k": "written"}
    assert (tmp_path / "gsm8k" / "test.jsonl").read_text().count("\n") == 5


def test_an_interrupted_fetch_leaves_no_half_benchmark(published, tmp_path):
    """The Hub fails on ARC-Challenge, after ARC-Easy's files are written: no ``ai2_arc``
    folder (the local suite would read ARC-Easy alone as complete), PIQA's complete one
    kept, and the next fetch writes ARC whole."""
    datasets = hub(published)

    def failing(path, name, split):
        if name == "ARC-Challenge":
            raise ConnectionError("the Hub went away")
        return datasets[(path, name, split)]

    with pytest.raises(ConnectionError):
        fetch(tmp_path, only=["piqa", "ai2_arc"], load=failing)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["piqa"]
    assert fetch(tmp_path, only=["piqa", "ai2_arc"], load=Hub(datasets)) == {
        "piqa": "kept",
        "ai2_arc": "written",
    }
    assert len(list((tmp_path / "ai2_arc").glob("*/**/*.jsonl"))) == 6


def test_the_command_line_names_its_choices(capsys):
    with pytest.raises(SystemExit):
        main(["/nowhere", "--only", "mnist"])
    assert "invalid choice: 'mnist'" in capsys.readouterr().err


@pytest.mark.parametrize("made", ["none", "empty"])
def test_a_local_suite_without_its_directory_is_refused_naming_it_and_the_command(
    made, tmp_path, capsys
):
    """eval.downstream --suite local: with no --local-data, a missing directory or one that
    holds no benchmark, a usage error names the directory and the command that writes it,
    before any checkpoint is read (the run directory does not exist either)."""
    from eval.downstream import main as downstream

    source = tmp_path / "benchmarks"
    if made == "empty":
        source.mkdir()
    with pytest.raises(SystemExit):
        downstream([str(tmp_path / "run"), "--suite", "local"])
    assert "--suite local needs --local-data DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        downstream([str(tmp_path / "run"), "--suite", "local", "--local-data", str(source)])
    error = capsys.readouterr().err
    assert str(source) in error and f"python -m eval.fetch_benchmarks {source}" in error


def test_trainer_downstream_data_that_is_missing_is_refused_before_any_write(corpus, tmp_path):
    from train_helpers import run_in_process, tiny_overrides
    from training.errors import ConfigError

    missing = tmp_path / "benchmarks"
    overrides = tiny_overrides(
        corpus,
        tmp_path / "run",
        **{"downstream.every": 6, "downstream.data": str(missing)},
    )
    with pytest.raises(ConfigError, match=rf"python -m eval.fetch_benchmarks {missing}"):
        run_in_process(overrides)
    assert not (tmp_path / "run").exists()


def test_trainer_downstream_data_without_a_tasks_files_is_refused_before_any_write(
    corpus, tmp_path
):
    """A directory that holds other benchmarks (``--only gsm8k``), or an interrupted fetch's
    hidden folder alone: the run ended at its first evaluation."""
    from train_helpers import run_in_process, tiny_overrides
    from training.errors import ConfigError

    data = tmp_path / "benchmarks"
    write_benchmarks(data)
    shutil.rmtree(data / "piqa")
    overrides = tiny_overrides(
        corpus,
        tmp_path / "run",
        **{
            "downstream.every": 6,
            "downstream.tasks": "[piqa,arc_easy]",
            "downstream.data": str(data),
        },
    )
    with pytest.raises(
        ConfigError, match=rf"no files for piqa: .*fetch_benchmarks {data} --only piqa"
    ):
        run_in_process(overrides)
    assert not (tmp_path / "run").exists()


def test_an_evaluator_without_a_check_still_gets_a_missing_directory_refused(corpus, tmp_path):
    """From Python, any callable is an evaluator; the trainer's own rule then covers the
    directory's existence."""
    from train_helpers import compose, tiny_overrides
    from training.errors import ConfigError
    from training.loop import Trainer

    missing = tmp_path / "benchmarks"
    overrides = tiny_overrides(
        corpus,
        tmp_path / "run",
        **{"downstream.every": 6, "downstream.data": str(missing)},
    )
    with pytest.raises(ConfigError, match=rf"no such directory; .*fetch_benchmarks {missing}"):
        Trainer(*compose(overrides), downstream=lambda *args: {})
    assert not (tmp_path / "run").exists()
