"""Every knob of the run's sections (the trainer, its parallelism, checkpoints, validation,
downstream evaluation, spikes, profiling and logging) is exercised by the end-to-end tier, or
says why not.

A field that no end-to-end case sets to a non-default value runs only at its default in the
tier, so a defect that shows only when it is changed goes unseen.
The cases are composed here as the tier launches them (no training), and a new field fails
this test until a case sets it or it is named below with a reason.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass

import pytest

from end_to_end import EXPERIMENTS, MATRIX, instruments, matrix_overrides, shrunk
from train_helpers import compose
from training.config import ExperimentConfig

# the sections that were the trainer's one bag, and its logging
RUN = (
    "trainer.",
    "parallel.",
    "checkpoint.",
    "validation.",
    "downstream.",
    "spikes.",
    "profile.",
    "logging.",
)
NOT_IN_THE_TIER = {
    "trainer.axes": "which keys name a run: tests/test_sweeps.py and the axes tests refuse "
    "a mismatched resume; the tier resumes the same run",
    "trainer.allow_changes": "a refused resume's way out: the tier resumes the same run; "
    "tests/test_refused_starts.py and tests/test_diagnostics.py change fixed keys with it",
    "logging.wandb.project": "wandb is a sink, off in the tier: tests/test_train.py's offline "
    "run checks what it receives",
    "logging.wandb.entity": "as logging.wandb.project",
    "logging.wandb.name": "as logging.wandb.project",
    "logging.wandb.group": "as logging.wandb.project",
    "logging.wandb.tags": "as logging.wandb.project",
    "parallel.float8": "FP8 matmuls need a GPU of compute capability 8.9+: a CPU run is refused "
    "(tests/test_float8.py); on a GPU, gpu_checks.sh first's fp8_loss and resume_fp8 run train.py "
    "with it",
    "parallel.float8_keep": "as parallel.float8; tests/test_float8.py checks which layers it keeps",
    "parallel.float8_auto_filter": "as parallel.float8; tests/test_float8.py checks the filter",
}


def leaves(node, prefix: str) -> dict[str, object]:
    out = {}
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            out.update(leaves(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def tier_cases(tmp_path) -> list[list[str]]:
    cases = []
    for experiment in EXPERIMENTS:
        base = shrunk(experiment, tmp_path) + instruments()
        cases.append(base)  # the stop at STOP comes from tests/faults.py: no key
    return cases + [matrix_overrides(point, tmp_path) for point in MATRIX]


@pytest.mark.slow
def test_every_run_setting_is_changed_by_some_case_or_excluded(tmp_path):
    defaults = {key: v for key, v in leaves(ExperimentConfig(), "").items() if key.startswith(RUN)}
    changed = set()
    for overrides in tier_cases(tmp_path):
        config, _ = compose(overrides)
        values = {key: v for key, v in leaves(config, "").items() if key.startswith(RUN)}
        changed |= {key for key, value in values.items() if value != defaults[key]}
    unexercised = sorted(set(defaults) - changed - set(NOT_IN_THE_TIER))
    assert not unexercised, (
        f"set these in a case of tests/end_to_end.py or exclude them: {unexercised}"
    )
    stale = sorted(set(NOT_IN_THE_TIER) & changed)
    assert not stale, f"excluded but exercised: {stale}"
    assert set(NOT_IN_THE_TIER) <= set(defaults), "an exclusion names no field"


@pytest.mark.parametrize("key", sorted(NOT_IN_THE_TIER))
def test_each_exclusion_gives_a_reason(key):
    assert len(NOT_IN_THE_TIER[key]) > 20
