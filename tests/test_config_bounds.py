"""Every integer knob's range is checked in one table, and the error names the key."""

import re
from dataclasses import replace

import pytest

from training.config import BOUNDS, ExperimentConfig, validate


def _with(config: ExperimentConfig, dotted: str, value) -> ExperimentConfig:
    section, key = dotted.split(".")
    return replace(config, **{section: replace(getattr(config, section), **{key: value})})


@pytest.mark.parametrize("key", [k for k in BOUNDS if k != "model.n_heads"])
def test_a_value_below_its_bound_is_refused_naming_the_key(key):
    below = BOUNDS[key] - 1
    with pytest.raises(ValueError, match=rf"^{re.escape(key)} must be .*got {below}$"):
        validate(_with(ExperimentConfig(), key, below))


def test_zero_heads_is_refused_when_the_model_config_is_built():
    with pytest.raises(ValueError, match=r"model\.n_heads=0"):
        _with(ExperimentConfig(), "model.n_heads", 0)


def test_the_defaults_are_within_bounds():
    validate(ExperimentConfig())
