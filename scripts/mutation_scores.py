"""Mutation score per module from mutmut's results (run ``bash scripts/mutation.sh`` first).

    python -m scripts.mutation_scores              # the table
    python -m scripts.mutation_scores --survivors  # and the name of every surviving mutant

A mutant is *killed* when a test fails on it, *survived* when every test that runs the mutated
function passes; *no tests* means no selected test runs that function at all. The score is
killed / (killed + survived + timeout): a mutant that no test reaches counts against the module
in its own column, not in the score, so the two questions ("is it tested?", "would a test
notice a change?") stay apart. *Not judged* counts the mutants a stopped or partial run has
not reached: a module's score is over its whole only where that column is 0. ``mutmut show
NAME`` prints a mutant's diff.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from scripts.common import markdown, mutant_statuses, read_mutant_statuses

ROOT = Path(__file__).resolve().parent.parent

COLUMNS = ("killed", "survived", "no tests", "timeout")
NOT_JUDGED = "not checked"  # mutmut's word for a mutant it has not run yet


def parse_results(text: str) -> dict[str, dict[str, str]]:
    """``mutmut results --all true`` output as {module: {mutant name: status}}."""
    return grouped(mutant_statuses(text))


def grouped(statuses: dict[str, str]) -> dict[str, dict[str, str]]:
    """{mutant name: status} by module: everything before the function (``x_``/``xǁ`` in
    ``common.mutant_statuses``' names)."""
    by_module: dict[str, dict[str, str]] = defaultdict(dict)
    for name, status in statuses.items():
        module = name.split(".x")[0] if ".x" in name else name.rsplit(".", 1)[0]
        by_module[module][name] = status
    return dict(by_module)


def score_rows(by_module: dict[str, dict[str, str]]) -> list[list[str]]:
    rows = []
    for module in sorted(by_module):
        counts = Counter(by_module[module].values())
        judged = counts["killed"] + counts["survived"] + counts["timeout"]
        score = f"{100 * counts['killed'] / judged:.1f}%" if judged else "-"
        rows.append([module, *(str(counts[c]) for c in COLUMNS), str(counts[NOT_JUDGED]), score])
    return rows


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--survivors", action="store_true", help="list the surviving mutants")
    args = parser.parse_args(argv)
    by_module = grouped(read_mutant_statuses(ROOT))
    rows = score_rows(by_module)
    print("\n".join(markdown(["module", *COLUMNS, "not judged", "score"], rows)))
    if args.survivors:
        for module in sorted(by_module):
            for name, status in sorted(by_module[module].items()):
                if status == "survived":
                    print(name)
    return rows


if __name__ == "__main__":
    main()
