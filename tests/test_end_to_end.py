"""The end-to-end tier: what is shipped, run as a cluster runs it (2 ranks, gloo, each its own
process started as torchrun starts one: ``train_helpers.run``).

Every experiment in ``configs/experiment/`` as shipped except its sizes
(``tests/end_to_end.py``: ``shrunk``), with every instrument on, is stopped by SIGTERM at a step
that is a validation, downstream, diagnostics and checkpoint step at once, then the same command
is run again, as SLURM's requeue does. Then a matrix of parallelism x precision x compile x
activation checkpointing beyond the presets. The anchor is torchtitan's integration tests: a list
of flag combinations, each trained end to end. Each combination is launched once and every
check reads the runs it left.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from data.mixture import normalised_weights
from end_to_end import (
    CHECKPOINTING,
    COMPILE,
    DECAY,
    EXPERIMENTS,
    MATRIX,
    MOVED,
    MOVED_PRESETS,
    MOVES,
    PRESETS_COVER,
    STEPS,
    STOP,
    expected_steps,
    instruments,
    matrix_overrides,
    shrunk,
)
from faults import faults_env
from train_helpers import compose, losses, metrics, run
from training.batch_ramp import BatchPlan

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REQUEUED = 75  # training/runtime/preemption.py: EXIT_PREEMPTED
TIMEOUT = 400  # a run of the tier takes 10-60 s on 2 cores: past this it hangs


def rank_exit_codes(output: str) -> list[int]:
    """Every rank's exit code, from the end of ``run``'s output."""
    return [int(code) for code in re.findall(r"exitcode\s*:\s*(-?\d+)", output)]


def stop_at(overrides: list[str], step: int, processes: int, run_dir) -> str:
    """Train on ``processes`` until SIGTERM at ``step``: checkpointed, exit 75 from each rank."""
    stop = faults_env(signal=f"SIGTERM@{step}")
    code, output = run(overrides, ranks=processes, timeout=TIMEOUT, env=stop)
    assert code == REQUEUED and set(rank_exit_codes(output)) == {REQUEUED}, output[-4000:]
    assert max(losses(run_dir)) == step
    return output


def moved(output: str, before: int, after: int) -> bool:
    """Whether a run's output says it resumed a checkpoint of ``before`` processes on ``after``."""
    return f"written by {before} processes and this run has {after}" in output


# After a move the data position is re-partitioned over the new layout (docs/data.md): the same
# text, every token once over the run, in other batches than the uninterrupted run's. The
# losses then follow the reference as closely as other batches of the same text allow.
AFTER_A_MOVE = 5e-2


def logged_steps(run_dir, key: str) -> list[int]:
    return sorted(m["step"] for m in metrics(run_dir) if key in m)


def assert_each_instrument_once_at_each_of_its_steps(run_dir, config) -> None:
    stable_end = BatchPlan(config).step_at(STEPS - DECAY)
    for key, steps in expected_steps(config.schedule.name, stable_end).items():
        assert logged_steps(run_dir, key) == steps, key


def assert_alphas_logged_in_fp32(run_dir) -> None:
    """xIELU's alphas as the fp32 parameters hold them: they moved from their initial values
    by less than bf16's spacing there (4e-3 at 0.8), and a bf16 gather or log would round
    every logged value to one of a few bf16 numbers."""
    alphas = [m["alpha_p/layer_00"] for m in metrics(run_dir) if "alpha_p/layer_00" in m]
    assert len(alphas) == STEPS
    assert len(set(alphas)) == STEPS  # each step moved them: none rounded to its neighbour
    for value in alphas:
        assert value != float(torch.tensor(value).bfloat16())


def assert_mixture_and_ramp(run_dir, config) -> None:
    """Every step took the batch and tokens of the ramp; each source gave its weight of the
    training tokens (to a window per stream: 2 streams); ``val/loss`` pools the sources'."""
    plan = BatchPlan(config)
    steps = [m for m in metrics(run_dir) if "loss" in m]
    assert [m["global_batch"] for m in steps] == [plan.batch(m["step"] - 1) for m in steps]
    assert [m["tokens"] for m in steps] == [plan.tokens_before(m["step"]) for m in steps]
    if config.trainer.batch_ramp:
        assert len({m["global_batch"] for m in steps}) == 2  # the ramp's stage was reached
    windows = steps[-1]["tokens"] / config.data.seq_len
    for entry, weight in zip(config.data.sources, normalised_weights(config.data), strict=True):
        assert abs(steps[-1][f"data/share/{entry.name}"] - weight) * windows <= 2, entry.name
    names = [entry.name for entry in config.data.sources]
    for m in (m for m in metrics(run_dir) if "val/loss" in m and names):
        pooled = sum(m[f"val/loss/{n}"] * m[f"val/tokens/{n}"] for n in names) / m["val/tokens"]
        assert m["val/loss"] == pytest.approx(pooled, rel=1e-12)


def assert_profiled(run_dir) -> None:
    traces = list((run_dir / "profile").glob("*.json*"))
    assert len(traces) >= 2, traces  # one Chrome trace per rank


# the shipped experiments, and the cluster preset under µP (width 32 over a base of 16)
CASES = {name: (name, ()) for name in EXPERIMENTS}
CASES["paper_1b-mup"] = ("paper_1b", ("model.parametrization=mup", "model.mup_base_dim=16"))
# Muon (training/muon.py) on FSDP2 bf16 compiled blocks, moved from 2 processes to 1 like the
# FSDP2 presets: each matrix orthogonalized whole, its momentum re-sharded by the checkpoint
CASES["paper_1b-muon"] = ("paper_1b", ("optim.name=muon",))
MOVED_CASES = (*MOVED_PRESETS, "paper_1b-muon")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each case's uninterrupted run, launched once for every check that compares."""
    done = {}

    def get(case: str):
        if case not in done:
            experiment, extra = CASES[case]
            run_dir = tmp_path_factory.mktemp(f"{case}-uninterrupted")
            overrides = [*shrunk(experiment, run_dir), *instruments(), *extra]
            code, output = run(overrides, ranks=2, timeout=TIMEOUT)
            assert code == 0, output[-4000:]
            done[case] = run_dir
        return done[case]

    return get


@pytest.mark.parametrize("case", CASES)
def test_each_shipped_experiment_survives_sigterm_at_a_measurement_step_and_resumes_exactly(
    case, uninterrupted, tmp_path
):
    experiment, extra = CASES[case]
    overrides = [*shrunk(experiment, tmp_path), *instruments(), *extra]
    config, _ = compose(overrides)
    stop = faults_env(signal=f"SIGTERM@{STOP}")
    code, output = run(overrides, ranks=2, timeout=TIMEOUT, env=stop)
    assert code == REQUEUED and rank_exit_codes(output) == [REQUEUED] * 2, output[-4000:]
    assert max(losses(tmp_path)) == STOP
    # stopped before measuring: the measurements of that step are pending in the checkpoint
    assert logged_steps(tmp_path, "val/loss") == []
    assert logged_steps(tmp_path, "downstream/seconds") == []

    moves = case in MOVED_CASES
    if moves:  # 2 processes again until MOVES[1], then 1 process to the end
        stop_at(overrides, MOVES[1], 2, tmp_path)
    code, output = run(overrides, ranks=1 if moves else 2, timeout=TIMEOUT)
    assert code == 0, output[-4000:]
    assert moved(output, 2, 1) == moves
    assert_each_instrument_once_at_each_of_its_steps(tmp_path, config)
    assert_alphas_logged_in_fp32(tmp_path)
    assert_profiled(tmp_path)
    reference = uninterrupted(case)
    assert_each_instrument_once_at_each_of_its_steps(reference, config)
    # bit for bit on 2 processes: the same kernels on the same inputs, whatever the wrapping
    exact_until = MOVES[1] if moves else STEPS
    per_source = [f"val/loss/{name}" for name, _ in config.data.mixture_parts()]
    if per_source or config.trainer.batch_ramp:
        for run_dir in (tmp_path, reference):
            assert_mixture_and_ramp(run_dir, config)
    compared = ("loss", "val/loss", "downstream/local_piqa/acc", "diag/pre_rms/layer_00")
    for key in (*compared, *per_source):
        resumed = {m["step"]: m[key] for m in metrics(tmp_path) if key in m}
        expected = {m["step"]: m[key] for m in metrics(reference) if key in m}
        assert resumed and resumed.keys() == expected.keys(), key
        # measurements due at the move's stop are taken after it, by the one process
        last_exact = exact_until - (moves and key != "loss")
        for step, value in expected.items():
            if step <= last_exact:
                assert resumed[step] == value, (key, step)
            else:
                assert resumed[step] == pytest.approx(value, rel=AFTER_A_MOVE), (key, step)


def test_every_parallelism_and_precision_moves_between_world_sizes():
    combinations = set(itertools.product(("ddp", "fsdp"), ("fp32", "bf16")))
    points = [*MOVED, *(PRESETS_COVER[name] for name in MOVED_PRESETS)]
    assert {(p[0], p[1]) for p in points} == combinations
    assert set(MOVED) <= set(MATRIX)
    assert {PRESETS_COVER[name][0] for name in MOVED_PRESETS} == {"fsdp"}
    fsdp_presets = {name for name, point in PRESETS_COVER.items() if point[0] == "fsdp"}
    assert set(MOVED_PRESETS) == fsdp_presets


def test_the_matrix_covers_every_pair_and_fsdp2_bf16_with_every_option():
    points = set(MATRIX) | set(PRESETS_COVER.values())
    values = (("ddp", "fsdp"), ("fp32", "bf16"), COMPILE, CHECKPOINTING)
    for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
        for x, y in itertools.product(a, b):
            assert any(p[i] == x and p[j] == y for p in points), (x, y)
    for c, a in itertools.product(COMPILE, CHECKPOINTING):
        assert ("fsdp", "bf16", c, a) in points


@pytest.mark.parametrize("point", MATRIX, ids="-".join)
def test_the_matrix_point_trains_with_every_instrument(point, uninterrupted, tmp_path):
    precision = point[1]
    overrides = matrix_overrides(point, tmp_path)
    moves = point in MOVED
    if moves:  # 2 processes, then 1, then 2 again: the checkpoints know no layout
        stop_at(overrides, MOVES[0], 2, tmp_path)
        assert moved(stop_at(overrides, MOVES[1], 1, tmp_path), 2, 1)
    code, output = run(overrides, ranks=2, timeout=TIMEOUT)
    assert moved(output, 1, 2) == moves
    assert code == 0, output[-4000:]
    expected = expected_steps("wsd")
    del expected["downstream/seconds"]  # off in the matrix (end_to_end.MATRIX_LEAVES_OUT)
    for key, steps in expected.items():
        assert logged_steps(tmp_path, key) == steps, key
    assert_alphas_logged_in_fp32(tmp_path)
    # the same model and data as the quickstart's DDP fp32 run: fp32 points follow it to
    # summation order; bf16 ones to bf16's rounding of the matmul operands
    reference = losses(uninterrupted("quickstart"))
    rel = 1e-4 if precision == "fp32" else 2e-2
    ours = losses(tmp_path)
    assert ours.keys() == reference.keys()
    for step, value in reference.items():
        tolerance = AFTER_A_MOVE if moves and step > MOVES[0] else rel
        assert ours[step] == pytest.approx(value, rel=tolerance), step


def test_every_dashboard_panel_reads_keys_a_run_of_the_tier_writes(uninterrupted):
    """``scripts.wandb_workspace``'s panels against what a real run logs (every instrument on,
    MFU at a stated CPU peak): a renamed metric fails here, not as an empty wandb panel."""
    from scripts.wandb_workspace import SECTIONS

    logged = {key for m in metrics(uninterrupted("paper_1b")) for key in m}
    empty = [f"{s}: {p.title}" for s, ps in SECTIONS.items() for p in ps if not p.shows(logged)]
    assert not empty, f"panels no run of the tier fills: {empty}"
