"""Every numeric knob's range is checked with its key, and the error names the key.

Each section checks its own keys when it is built (composing the config) and again when
``training.checks.check_config`` asks it; both before a run starts. The bounds are written out
here, not read from the code they test.
"""

import math
import re
from dataclasses import fields, is_dataclass, replace

import pytest

from data.config import DataConfig, MixtureSource
from train_helpers import with_setting as _with
from training.checks import check_config
from training.config import ExperimentConfig

COUNTS = (  # at least 1
    "vocab_size dim n_layers n_heads n_kv_heads gated_hidden mlp_hidden max_seq_len "
    "init_reference_dim vocab_multiple loss_chunk_tokens rope_original_max_seq_len"
)
BOUNDS = {
    **{f"model.{key}": 1 for key in COUNTS.split()},
    "data.seq_len": 1,
    "data.validation_documents": 0,
    "data.num_workers": 0,
    "data.hub_retries": 0,
    "data.hub_backoff_s": 0,
    "schedule.warmup_steps": 0,
    "schedule.decay_steps": 0,
    **{f"trainer.{key}": 1 for key in ("steps", "global_batch", "micro_batch", "log_every")},
    "parallel.collective_timeout_s": 1,
    "checkpoint.every": 0,
    "checkpoint.keep": 1,
    "validation.every": 0,
    "validation.batches": 0,
    "downstream.every": 0,
    "spikes.window": 0,
    "spikes.skip_limit": 1,
    "spikes.max_bad_steps": 1,
    "logging.diagnostics_every": 0,
    "logging.grad_norms_every": 0,
    "logging.outliers_every": 0,
    "loss.goldfish_k": 0,
    "loss.goldfish_h": 1,
    "loss.z_loss": 0,
    "optim.weight_decay": 0,
    "optim.grad_clip": 0,
    "optim.ademamix.alpha": 0,
    "optim.ademamix.alpha_warmup": 0,
    "optim.ademamix.beta3_warmup": 0,
}


@pytest.mark.parametrize("key", list(BOUNDS))
def test_a_value_below_its_bound_is_refused_naming_the_key(key):
    below = BOUNDS[key] - 1
    with pytest.raises(ValueError, match=rf"^{re.escape(key)} must be .*got {below}$"):
        check_config(_with(ExperimentConfig(), key, below))


def test_a_refusal_gives_the_reason_of_a_rule_that_needs_one_and_no_other_words():
    """A bound whose reason is not plain says it, in parentheses."""
    with pytest.raises(ValueError) as refused:
        check_config(_with(ExperimentConfig(), "optim.lr", 0.0))
    assert str(refused.value) == "optim.lr must be positive (0 trains nothing), got 0.0"
    with pytest.raises(ValueError) as refused:
        check_config(_with(ExperimentConfig(), "loss.z_loss", -1.0))
    assert str(refused.value) == "loss.z_loss must be >= 0, got -1.0"


def test_the_defaults_are_within_bounds():
    check_config(ExperimentConfig())


def test_the_checks_write_nothing_into_the_config():
    """The global batch given in tokens is computed where it is read, never written back."""
    config = _with(ExperimentConfig(), "trainer.global_batch_tokens", 16 * 256)
    before = repr(config)
    check_config(config)
    assert repr(config) == before
    assert config.sequences_per_step == 16 and config.trainer.global_batch == 8


def _float_keys(node, prefix: str) -> list[str]:
    """Every float field of the schema, by its dotted key."""
    keys = []
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            keys += _float_keys(value, f"{prefix}{f.name}.")
        elif f.type == "float":
            keys.append(prefix + f.name)
    return keys


FLOAT_KEYS = _float_keys(ExperimentConfig(), "")


def _refused(config_of, key: str) -> None:
    """Building the config (its dataclasses' own checks) or checking it raises, naming key."""
    with pytest.raises(ValueError, match=rf"(^|\s){re.escape(key)}\b"):
        check_config(config_of())


def test_the_schema_has_the_float_settings_that_must_be_finite():
    for key in ("optim.lr", "optim.grad_clip", "optim.eps", "model.init_std", "model.norm_eps"):
        assert key in FLOAT_KEYS


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_setting_refuses_a_non_finite_value_by_name(key, value):
    _refused(lambda: _with(ExperimentConfig(), key, value), key)


@pytest.mark.parametrize(
    "key, value",
    [
        ("optim.eps", -1.0),
        ("optim.eps", 0.0),
        ("optim.weight_decay", -0.1),
        ("model.init_std", 0.0),
        ("model.norm_eps", -1e-5),
        ("model.rope_theta", 0.0),
        ("optim.ademamix.alpha", -1.0),
    ],
)
def test_a_float_setting_out_of_its_range_is_refused_by_name(key, value):
    _refused(lambda: _with(ExperimentConfig(), key, value), key)


def test_a_float_inside_a_list_or_a_mapping_is_checked_too():
    def mixture(weight):
        sources = [MixtureSource(name="a", weight=weight), MixtureSource(name="b")]
        return replace(ExperimentConfig(), data=DataConfig(source="mixture", sources=sources))

    _refused(lambda: mixture(math.inf), "data.sources[0].weight")
    _refused(lambda: _with(ExperimentConfig(), "optim.betas", (0.9, math.nan)), "optim.betas")
    kwargs = {"alpha_p_init": math.nan}
    _refused(
        lambda: _with(ExperimentConfig(), "model.activation_kwargs", kwargs),
        "model.activation_kwargs.alpha_p_init",
    )
    check_config(mixture(3.0))
