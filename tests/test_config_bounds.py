"""Every numeric knob's range is checked with its key, and the error names the key.

The model's and the data's ranges are checked when their dataclasses are built (composing the
config), the schedule's and the trainer's by ``training.checks.check_config``; both before a
run starts.
"""

import re
from dataclasses import replace

import pytest

from data.config import BOUNDS as DATA_BOUNDS
from model.config import BOUNDS as MODEL_BOUNDS
from training.checks import check_config
from training.config import BOUNDS as TRAINER_BOUNDS
from training.config import ExperimentConfig

BOUNDS = {
    **{f"model.{key}": low for key, low in MODEL_BOUNDS.items()},
    **{f"data.{key}": low for key, low in DATA_BOUNDS.items()},
    "schedule.warmup_steps": 0,
    "schedule.decay_steps": 0,
    **TRAINER_BOUNDS,
}


def _with(config: ExperimentConfig, dotted: str, value) -> ExperimentConfig:
    section, key = dotted.split(".")
    return replace(config, **{section: replace(getattr(config, section), **{key: value})})


@pytest.mark.parametrize("key", list(BOUNDS))
def test_a_value_below_its_bound_is_refused_naming_the_key(key):
    below = BOUNDS[key] - 1
    with pytest.raises(ValueError, match=rf"^{re.escape(key)} must be .*got {below}$"):
        check_config(_with(ExperimentConfig(), key, below))


def test_the_defaults_are_within_bounds():
    check_config(ExperimentConfig())


def test_the_checks_write_nothing_into_the_config():
    """The global batch given in tokens is computed where it is read, never written back."""
    config = _with(ExperimentConfig(), "trainer.global_batch_tokens", 16 * 256)
    before = repr(config)
    check_config(config)
    assert repr(config) == before
    assert config.sequences_per_step == 16 and config.trainer.global_batch == 8
