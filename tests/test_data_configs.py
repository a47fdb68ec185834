"""The Hydra data presets are valid DataConfigs."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data import DataConfig

PRESETS = sorted((Path(__file__).resolve().parents[1] / "configs" / "data").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_data_presets_build(path):
    values = OmegaConf.to_container(OmegaConf.load(path))
    if values["source"] in ("local", "tokenized"):
        assert values["paths"] == []  # the user must point at their files
        values["paths"] = ["/data/*.parquet"]
    config = DataConfig(**values)
    assert config.source == path.stem


def test_all_four_sources_have_a_preset():
    assert {p.stem for p in PRESETS} == {"builtin", "local", "fineweb_edu", "tokenized"}
