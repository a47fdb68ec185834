"""Mutation testing of the module you changed, against the tests you name, in one process.

    python -m scripts.mutation training.schedule tests/test_schedule.py tests/test_batch_ramp.py
    python -m scripts.mutation training.step.x_token_weights tests/test_train_step.py  # a function

It generates mutmut's mutants (``[tool.mutmut]`` in pyproject.toml says of which modules; a
module you changed must be listed there), switches each mutant of the prefix on in turn with
mutmut's own ``MUTANT_UNDER_TEST``, runs the named tests on it (quick ones and those marked
``mutation``, stopping at the first failure, with a time limit per mutant: an endless loop is a
timeout, which counts as caught), and prints every survivor's diff.

A survivor is a change none of the named tests noticed: kill it with a test (seen failing on the
mutant), or say in the issue's note why it cannot alter behaviour. A test not named might kill
it; ``mutmut run 'PREFIX*'`` runs every test that reaches the function, which takes hours here
for a function every training run reaches (each of its mutants reruns every trainer test).
Tests are imported once for all mutants, so module-level state a test leaves behind is shared:
a survivor is worth a second look before it is counted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
SELECTION = "(not slow or mutation) and not gpu"  # what mutmut's own run selects (pyproject)


def mutant_statuses(results: str) -> dict[str, str]:
    """``mutmut results --all true`` output as {mutant name: status}. Names are
    ``package.module.function__mutmut_N`` (``x_`` before a function, ``xǁClassǁ`` before a
    method); the lines naming files are skipped."""
    statuses = {}
    for line in results.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            statuses[name] = status.strip()
    return statuses


def mutant_names(statuses: dict[str, str], prefix: str) -> list[str]:
    """The mutants of a module (``training.step``) or a function (``training.step.x_name``)."""
    return [name for name in statuses if name.startswith(prefix.rstrip(".") + ".")] or [
        name for name in statuses if name.startswith(prefix)
    ]


def generate() -> dict[str, str]:
    """Every configured module's mutants in a fresh ``mutants/`` (mutmut's own first step, as
    ``mutmut run`` takes it before it runs any test), and their statuses. Fresh: mutmut keeps
    the mutants of files it has copied before, so a module added to ``only_mutate`` or a
    changed test would otherwise be judged on a stale copy."""
    shutil.rmtree(MUTANTS, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-c", "import mutmut.__main__ as m; m.set_mutant_under_test("
         "'mutant_generation'); import os; os.makedirs('mutants', exist_ok=True); "
         "m.copy_src_dir(); m.copy_also_copy_files(); m.setup_source_paths(); "
         "m.store_lines_covered_by_tests(); m.create_mutants(2)"],
        cwd=ROOT,
        check=True,
    )  # fmt: skip
    results = subprocess.run(
        ["mutmut", "results", "--all", "true"], capture_output=True, text=True, cwd=ROOT
    )
    return mutant_statuses(results.stdout)


class MutantTimeoutError(Exception):
    """Raised inside the tests when a mutant has run past its time (an endless loop)."""


def _time_up(signum, frame) -> None:
    raise MutantTimeoutError


def judge(names: list[str], tests: list[str], limit_s: int) -> dict[str, str]:
    """{mutant: "killed", "survived" or "timeout"}, each mutant switched on in turn."""
    import pytest

    os.chdir(MUTANTS)
    sys.path[:0] = [str(MUTANTS), str(MUTANTS / "tests")]
    args = ["-q", "-x", "-n", "0", "-p", "no:cacheprovider", "-m", SELECTION, *tests]
    verdicts = {}
    signal.signal(signal.SIGALRM, _time_up)
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        output = io.StringIO()
        signal.alarm(limit_s)
        try:
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                code = pytest.main(args)
        except MutantTimeoutError:
            code = None
        finally:
            signal.alarm(0)
        timed_out = code is None or "MutantTimeoutError" in output.getvalue()
        verdicts[name] = "timeout" if timed_out else "survived" if code == 0 else "killed"
        print(name, verdicts[name], flush=True)
    return verdicts


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", help="a module (training.schedule) or a function's mutants")
    parser.add_argument("tests", nargs="+", help="test files or node ids, as pytest takes them")
    parser.add_argument("--limit-s", type=int, default=60, help="time per mutant (default 60)")
    args = parser.parse_args(argv)
    names = mutant_names(generate(), args.prefix)
    if not names:
        raise SystemExit(
            f"no mutant of {args.prefix!r}: is its file in [tool.mutmut] only_mutate "
            "(pyproject.toml)?"
        )
    verdicts = judge(names, args.tests, args.limit_s)  # read in mutants/, relative to it
    survivors = [name for name, verdict in verdicts.items() if verdict == "survived"]
    for name in survivors:
        subprocess.run(["mutmut", "show", name], cwd=ROOT, check=False)
    print(f"{len(survivors)} of {len(names)} survived the named tests")
    return verdicts


if __name__ == "__main__":
    main()
