"""The scoring benchmark end to end on a tiny head: both rows, the same numbers, a ratio."""

import pytest

from scripts.bench.scoring import main


def test_both_rows_are_timed_and_the_table_gives_ratios_to_the_first(capsys):
    args = "--batch 2 --length 12 --continuation 3 --dim 8 --vocab 64 --warmup 0 --repeats 1"
    rows = main(args.split())
    assert [row["name"] for row in rows] == [
        "continuation tokens only (token_scores)",
        "full logits, then pick",
    ]
    assert all(row["ms"] > 0 and row["peak_gib"] is None for row in rows)  # CPU: no peak
    out = capsys.readouterr().out
    assert "2 requests of 12 tokens (3 scored each), dim 8 x vocab 64" in out
    assert "| x1.000 |" in out


def test_a_continuation_longer_than_the_request_is_refused():
    with pytest.raises(SystemExit, match=r"--continuation must be in 1\.\.--length"):
        main(["--length", "4", "--continuation", "5"])
