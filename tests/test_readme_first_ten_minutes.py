"""README's first ten minutes, every command of it, in order, as a new user runs them: from the
root of a bare clone (the repository's files copied to a folder with nothing beside it, so no
``../shared``), each one's exit code and what it says it makes checked.

Two things differ from a user's machine, and only these: the commands that train after the
first one stop after a few steps (the Tekken run alone takes 18 minutes on 2 cores at 480), and
``eval.fetch_benchmarks`` reads datasets built here in the Hub's layouts instead of the Hub
(``tests/hf_layouts.py``), in this process. ``/path/to/benchmarks`` becomes a folder of the test.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark_fixtures import write_benchmarks
from hf_layouts import Hub, hub
from train_helpers import ROOT, TEST_ENVIRONMENT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# the overrides appended to every training command after the first: a few steps of the same run
SHORT = [
    "trainer.steps=6",
    "validation.every=6",
    "checkpoint.every=6",
    "schedule.warmup_steps=2",
    "schedule.decay_steps=2",
]


def first_ten_minutes() -> list[str]:
    """The commands of README's section, in its order: each inline code span that runs python."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## First ten minutes", 1)[1].split("\n## ", 1)[0]
    spans = re.findall(r"`([^`]+)`", section.replace("\n", " "))
    return [re.sub(r"\s+", " ", s) for s in spans if s.startswith("python ")]


def bare_clone(where: Path) -> Path:
    """The repository's files (tracked, and untracked but not ignored), copied under ``where``."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    clone = where / "clone"
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            (clone / name).write_bytes(source.read_bytes())
    return clone


def test_every_command_of_the_first_ten_minutes_runs_in_a_bare_clone(tmp_path, monkeypatch):
    commands = first_ten_minutes()
    modules = [c.split()[2] if c.startswith("python -m ") else c.split()[1] for c in commands]
    assert modules == [
        "train.py",
        "eval.generate",
        "scripts.plot_curves",
        "eval.perplexity",
        "eval.fetch_benchmarks",
        "eval.downstream",
        "train.py",
        "train.py",
    ], commands
    clone = bare_clone(tmp_path)
    assert not any((parent / "shared").exists() for parent in clone.parents)
    benchmarks = tmp_path / "benchmarks"
    stand_in = Hub(hub(write_benchmarks(tmp_path / "published")))
    monkeypatch.setattr("eval.fetch_benchmarks.load_split", stand_in)
    env = {**os.environ, **TEST_ENVIRONMENT}
    trained = 0
    for command in commands:
        argv = shlex.split(command.replace("/path/to/benchmarks", str(benchmarks)))
        if argv[:3] == ["python", "-m", "eval.fetch_benchmarks"]:
            from eval.fetch_benchmarks import main

            assert set(main(argv[3:]).values()) == {"written"}
            continue
        if argv[1] == "train.py":
            argv += SHORT if trained else []
            trained += 1
        done = subprocess.run(
            [sys.executable, *argv[1:]],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output[-3000:]}"
        if "eval.downstream" in argv:
            assert "| Aggregate Score |" in output, output[-3000:]
    runs = clone / "runs"
    assert (runs / "quickstart-xielu" / "curves.png").is_file()
    for run in ("quickstart-xielu", "quickstart-swiglu", "quickstart-tekken-xielu"):
        assert (runs / run / "metrics.jsonl").is_file(), run
