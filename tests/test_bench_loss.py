"""The LM-head benchmark end to end on a tiny head: one row per setting, ratios to the first."""

from scripts.bench.loss import main


def test_a_row_per_chunk_size_and_the_full_logits_reference(capsys):
    args = "--tokens 48 --dim 8 --vocab 64 --chunks 16 64 --no-compile --warmup 0 --repeats 1"
    rows = main(args.split())
    assert [row["name"] for row in rows] == ["chunk 16, eager", "chunk 64, eager", "full logits"]
    assert all(row["ms"] > 0 and row["peak_gib"] is None for row in rows)  # CPU: no peak
    out = capsys.readouterr().out
    assert "48 tokens x dim 8 x vocab 64" in out
    assert out.count("| chunk") == 2 and "| chunk 16, eager |" in out and "| x1.000 |" in out
