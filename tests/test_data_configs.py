"""The Hydra data presets are valid DataConfigs, one per registered source."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data import DataConfig, available_sources, get_source

PRESETS = sorted((Path(__file__).resolve().parents[1] / "configs" / "data").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_data_presets_build(path):
    """A preset sets what differs from DataConfig's defaults; merged over them, it builds."""
    preset = OmegaConf.load(path) or {}
    values = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(DataConfig), preset))
    if get_source(values["source"]).needs_paths:
        assert values["paths"] == []  # the user must point at their files
        values["paths"] = ["/data/*.parquet"]
    config = DataConfig(**values)
    assert config.source == path.stem


def test_every_registered_source_has_a_preset():
    assert {p.stem for p in PRESETS} == set(available_sources())
