"""The efficiency-table script end to end on a tiny model: rows, matched sizes, the paper's ratios.

Times are not asserted (benchmarks measure, tests check behaviour); sizes and saved bytes are.
"""

from eval.paper import EFFICIENCY_TABLE
from scripts.bench_throughput import main


def test_efficiency_table_matches_sizes_and_prints_the_papers_ratios(tmp_path, capsys):
    rows = main(
        "--dim 64 --layers 2 --vocab-size 256 --batch 2 --seq 32 --warmup 0 --repeats 1 "
        f"--activations xielu swiglu --csv {tmp_path / 'table.csv'}".split()
    )
    by_name = {r["activation"]: r for r in rows}
    assert set(by_name) == {"xielu", "swiglu", "relu2"}  # the baseline is always measured
    # matched size: plain MLPs 1.5x wider than gated, equal parameters up to xIELU's 2L scalars
    assert by_name["swiglu"]["mlp_hidden"] * 3 == by_name["xielu"]["mlp_hidden"] * 2
    extra = (by_name["xielu"]["parameters_m"] - by_name["swiglu"]["parameters_m"]) * 1e6
    assert round(extra) == 2 * 2  # alpha_p, alpha_n in each of 2 layers
    # xIELU's fused op keeps only its input (and its scalars) for backward, as ReLU² keeps its
    # input; SwiGLU keeps gate and up (2 x 256 numbers per token against 384)
    extra_saved = (by_name["xielu"]["saved_gib"] - by_name["relu2"]["saved_gib"]) * 2**30
    assert 0 <= extra_saved <= 2 * 4 * 4  # at most 4 fp32 scalars per layer
    assert by_name["swiglu"]["saved_gib"] > by_name["relu2"]["saved_gib"]
    assert all(r["ms_per_iteration"] > 0 and r["peak_gib"] is None for r in rows)  # CPU

    out = capsys.readouterr().out
    paper = {r.activation: r.ms_per_iteration for r in EFFICIENCY_TABLE}
    xielu_line = next(line for line in out.splitlines() if line.startswith("| xielu |"))
    assert f"{paper['xielu'] / paper['relu2']:.3f}" in xielu_line  # 560 / 534 = 1.049
    assert (tmp_path / "table.csv").read_text().count("\n") == 4
