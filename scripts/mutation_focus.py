"""Judge one module's mutants against the tests you name, in one process: minutes where a full
``mutmut run`` takes hours on 2 cores.

    python -m scripts.mutation_focus training.step. tests/test_train_step.py tests/test_loss_mask.py

Why: mutmut runs, for each mutant, every selected test that reached the mutated function. A
function that every training run reaches (the loss, the schedule, the activation's formulas,
the closing sample's ``filter_logits``) sends each of its mutants through every trainer test
in the selection, 30-60 s a mutant here; the whole configured set would take about ten hours.
This pass runs only the named tests, quick ones first, stopping at the first failure, with
the mutant switched on by mutmut's own ``MUTANT_UNDER_TEST``, and a time limit per mutant
(a mutant that loops forever is a *timeout*, which mutmut counts as caught too).

A mutant killed here is killed. One that survives here is a candidate: a test not named may
kill it (mutmut's full run decides), or no test does; read it (``mutmut show NAME``) and
write the test, or note why it is equivalent. It needs the mutants a ``mutmut run`` generated
in ``mutants/`` (stopping that run after "Generating mutants" is enough). Tests are imported
once for all mutants, so module-level state a test leaves behind is shared: a survivor here is
worth a second look before it is counted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import sys
from pathlib import Path

from scripts.common import read_mutant_statuses

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
SELECTION = "(not slow or mutation) and not gpu"  # what mutmut's run selects (pyproject.toml)


def mutant_names(statuses: dict[str, str], prefix: str) -> list[str]:
    """The mutants whose names start with ``prefix`` (``training.step.`` for a module,
    ``training.step.x_train_step__`` for one function), of ``common.mutant_statuses``."""
    return [name for name in statuses if name.startswith(prefix)]


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
    parser.add_argument("prefix", help="mutant names to judge start with this (a module + '.')")
    parser.add_argument("tests", nargs="+", help="test files or node ids, as pytest takes them")
    parser.add_argument("--limit-s", type=int, default=60, help="time per mutant (default 60)")
    args = parser.parse_args(argv)
    if not MUTANTS.is_dir():
        raise SystemExit(f"no {MUTANTS}: run `mutmut run` until it has generated the mutants")
    names = mutant_names(read_mutant_statuses(ROOT), args.prefix)
    if not names:
        raise SystemExit(f"no mutant's name starts with {args.prefix!r}")
    verdicts = judge(names, args.tests, args.limit_s)
    survivors = sum(v == "survived" for v in verdicts.values())
    print(f"{survivors} of {len(names)} survived the named tests")
    return verdicts


if __name__ == "__main__":
    main()
