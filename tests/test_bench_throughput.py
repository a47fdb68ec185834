"""The efficiency-table script end to end on a tiny model: rows, matched sizes, the paper's ratios.

Times are not asserted (benchmarks measure, tests check behaviour); sizes and saved bytes are.
"""

import pytest

from eval.paper import EFFICIENCY_TABLE
from scripts.bench.throughput import main


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_grid_of_settings_gives_a_group_of_rows_each_and_the_fastest_per_activation(capsys):
    tiny = "--dim 32 --layers 1 --vocab-size 128 --batch 2 --seq 16 --warmup 0 --repeats 1"
    rows = main([*tiny.split(), "--checkpointing", "none", "selective", "--activations", "xielu"])
    settings = [(r["activation"], r["checkpointing"]) for r in rows]
    assert settings == [
        ("xielu", "none"),
        ("relu2", "none"),
        ("xielu", "selective"),
        ("relu2", "selective"),
    ]
    # selective checkpointing keeps the matmul outputs but recomputes the pointwise work
    by = {(r["activation"], r["checkpointing"]): r for r in rows}
    assert by[("xielu", "selective")]["saved_gib"] < by[("xielu", "none")]["saved_gib"]
    out = capsys.readouterr().out
    for checkpointing in ("none", "selective"):  # activation, batch, compile, checkpointing
        assert out.count(f"| relu2 | 2 | none | {checkpointing} |") == 1
    assert "fastest settings per activation:" in out


def test_an_out_of_memory_row_is_a_row_that_says_what_to_try(tmp_path):
    from scripts.bench.throughput import fastest_settings, table
    from scripts.common import write_csv

    fit = {
        "activation": "relu2",
        "batch": 5,
        "compile": "blocks",
        "checkpointing": "selective",
        "mlp_hidden": 9216,
        "parameters_m": 1100.0,
        "oom": False,
        "ms_per_iteration": 400.0,
        "tokens_per_s": 51200.0,
        "mfu": 0.46,
        "saved_gib": 20.0,
        "peak_gib": 70.0,
        "peak_percent": 88.0,
    }
    oom = {"activation": "relu2", "mlp_hidden": 9216, "batch": 5, "compile": "blocks"}
    oom |= {"checkpointing": "none", "oom": True}
    lines = table([oom, fit])
    assert any("OOM at batch 5: try --checkpointing" in line for line in lines)
    assert all(line.count("|") == lines[0].count("|") for line in lines)  # every row complete
    assert fastest_settings([oom, fit]) == {"relu2": fit}
    write_csv([oom, fit], tmp_path / "rows.csv")  # the OOM row lacks the measured keys
    header = (tmp_path / "rows.csv").read_text().splitlines()[0]
    assert header.startswith("activation,mlp_hidden,batch") and "tokens_per_s" in header
