"""The config dataclasses are the one home of every default: a YAML file under configs/ sets only
what differs from what it would otherwise get, so that changing a dataclass default changes
every run that does not say otherwise.

- A group file (``configs/model/paper_1b.yaml``) sets nothing equal to the dataclass default.
- An experiment sets nothing equal to what its groups (``train.yaml``'s defaults, with the
  experiment's overrides) already give.
"""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from end_to_end import INITIAL_HF, starts_from_published_weights
from train_helpers import CONFIGS, compose
from training.config import ExperimentConfig

GROUP_PACKAGES = {"model": "model", "data": "data", "schedule": "schedule", "recipe": ""}


def leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if key == "defaults":
            continue
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def schema_defaults():
    return OmegaConf.structured(ExperimentConfig)


def value_at(config, dotted: str):
    value = OmegaConf.select(config, dotted)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def selected_groups(experiment: dict) -> dict[str, str]:
    """Group -> option: train.yaml's defaults, then the experiment's ``override /group: x``."""
    chosen = {}
    for entry in OmegaConf.to_container(OmegaConf.load(CONFIGS / "train.yaml"))["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            if group in GROUP_PACKAGES:
                chosen[group] = option
    for entry in experiment.get("defaults", []):
        if isinstance(entry, str):  # _self_, or another experiment this one builds on
            if entry.startswith("/experiment/"):
                chosen.update(selected_groups(parent(entry)))
            continue
        ((key, option),) = entry.items()
        group = key.removeprefix("override ").strip("/")
        if (CONFIGS / group / f"{option}.yaml").is_file():  # not register_configs' options
            chosen[group] = option
    return chosen


def parent(entry: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{entry.strip('/')}.yaml"))


def packaged(group: str, body) -> dict:
    """A group file's values where they land in the config (a ``_global_`` one: as written)."""
    package = GROUP_PACKAGES[group]
    return {package: body or {}} if package else (body or {})


GROUP_FILES = sorted(p for g in GROUP_PACKAGES for p in (CONFIGS / g).glob("*.yaml"))
EXPERIMENTS = sorted((CONFIGS / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_group_file_sets_only_values_that_differ_from_the_dataclass(path: Path):
    package = GROUP_PACKAGES[path.parent.name]
    defaults = schema_defaults()
    body = OmegaConf.to_container(OmegaConf.load(path)) or {}
    where = f"{package}." if package else ""
    restated = [
        f"{where}{key}={value!r}"
        for key, value in leaves(body)
        if value == value_at(defaults, f"{where}{key}")
    ]
    assert not restated, f"{path} restates dataclass defaults: {restated}"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_an_experiment_sets_only_values_its_groups_do_not_already_give(path: Path):
    experiment = OmegaConf.to_container(OmegaConf.load(path))
    base = schema_defaults()
    for group, option in selected_groups(experiment).items():
        body = OmegaConf.to_container(OmegaConf.load(CONFIGS / group / f"{option}.yaml"))
        base = OmegaConf.merge(base, OmegaConf.create(packaged(group, body)))
    for entry in experiment.get("defaults", []):  # the experiments it builds on, then its own
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            inherited = {k: v for k, v in parent(entry).items() if k != "defaults"}
            base = OmegaConf.merge(base, OmegaConf.create(inherited))
    restated = [
        f"{key}={value!r}" for key, value in leaves(experiment) if value == value_at(base, key)
    ]
    assert not restated, f"{path} restates what its groups give: {restated}"
    # a preset that starts from published weights reads its model from a (tiny) checkpoint
    starts = [f"checkpoint.initial_hf={INITIAL_HF}"] * starts_from_published_weights(path.stem)
    config, _ = compose([f"experiment={path.stem}", "data.paths=[/x/*.parquet]", *starts])
    composed = OmegaConf.structured(config)
    for key, value in leaves(experiment):  # and every value it sets arrives
        if isinstance(value, str) and value.startswith("${"):  # an interpolation: its target's
            value = value_at(composed, value[2:-1])
        assert value_at(composed, key) == value, key


@pytest.mark.slow
def test_every_registered_activation_is_a_command_line_choice_without_a_yaml_file():
    from xielu import available_activations

    assert not (CONFIGS / "activation").exists()
    for name in available_activations():
        config, _ = compose([f"activation={name}"])
        assert config.model.activation == name


def test_an_activation_registered_after_the_configs_is_a_choice_at_the_next_compose():
    """register_configs stores each entry once per process, and what was registered since."""
    import torch

    from xielu.registry import _REGISTRY, register

    compose([])
    register("late_relu", lambda **kwargs: torch.nn.ReLU(), "registered after a compose")
    try:
        config, _ = compose(["activation=late_relu"])
        assert config.model.activation == "late_relu"
    finally:
        _REGISTRY.pop("late_relu")
