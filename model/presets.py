"""The model presets of ``configs/model/`` (the Hydra group) as ModelConfig objects.

The YAML files are the single source of the preset values; this module only reads them, so
scripts and tests see exactly what ``train.py model=paper_1b`` composes.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from model.config import ModelConfig

PRESET_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str, **overrides) -> ModelConfig:
    """``configs/model/<name>.yaml`` as a ModelConfig, with keyword overrides applied."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(
            f"model preset {name!r} not found in {PRESET_DIR}; choose one of: "
            f"{', '.join(available_presets())}"
        )
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    unknown = set(overrides) - set(ModelConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown model keys {sorted(unknown)}")
    return ModelConfig(**{**values, **overrides})
