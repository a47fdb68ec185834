"""The keys that say which run a run directory holds, and the refusal to resume another one.

The trainer resumes whatever checkpoint its ``trainer.run_dir`` holds: that is what makes a
requeued SLURM job go on where it stopped. It is also how a grid over learning rates that put
every job in one directory would have each later job resume the first one's final checkpoint
and train zero steps. So each run writes the values of its axes (``trainer.axes``: the default
ones plus whatever a sweep varies) to ``axes.json`` beside ``config.yaml``, and a run whose
axes differ from the ones of the checkpoints it finds refuses to start, naming the key.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import OmegaConf

from training.checkpoint.layout import CONFIG_FILE, complete_checkpoints
from training.config import ConfigError, config_value

AXES_FILE = "axes.json"
log = logging.getLogger(__name__)
_MISSING = object()


def axes_of(config) -> dict:
    """``{key: value}`` for every key of ``trainer.axes``, with JSON-friendly values."""
    return {key: _plain(config_value(config, key)) for key in config.trainer.axes}


def _plain(value):
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _saved_axes(run_dir: Path, keys) -> dict:
    """What the run that wrote ``run_dir``'s checkpoints had for ``keys``: from ``axes.json``,
    or, for a key it does not list, from the ``config.yaml`` the run saved."""
    saved = {}
    axes_file = run_dir / AXES_FILE
    if axes_file.is_file():
        try:
            saved = json.loads(axes_file.read_text())
        except json.JSONDecodeError:  # a crash while it was written: config.yaml says the same
            log.warning("%s is damaged; reading the run's axes from %s", axes_file, CONFIG_FILE)
    config_file = run_dir / CONFIG_FILE
    yaml = None
    if config_file.is_file() and not all(key in saved for key in keys):
        try:
            yaml = OmegaConf.load(config_file)
        except Exception as error:  # a crash while it was written (before it was atomic)
            log.warning("%s cannot be read (%s); its keys are not compared", config_file, error)
    out = {}
    for key in keys:
        if key in saved:
            out[key] = saved[key]
            continue
        value = None if yaml is None else OmegaConf.select(yaml, key, default=_MISSING)
        if value is not _MISSING and yaml is not None:
            out[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return out


def refuse_other_runs_checkpoints(run_dir: str | Path, config) -> None:
    """Raise ``ConfigError`` when ``run_dir`` holds checkpoints of a run whose axes differ.

    Called before anything is written. A directory without checkpoints is free to take.
    """
    run_dir = Path(run_dir)
    if not complete_checkpoints(run_dir):
        return
    ours = axes_of(config)
    theirs = _saved_axes(run_dir, ours)
    for key, value in ours.items():
        if key in theirs and not _same(theirs[key], value):
            raise ConfigError(
                f"{run_dir} holds checkpoints of a run with {key}={theirs[key]!r}, and this run "
                f"has {key}={value!r}: resuming would continue the other run. Give this run its "
                "own trainer.run_dir (python -m scripts.sweep does, per grid point), remove the "
                f"old run, or drop {key} from trainer.axes to change it on purpose."
            )


def _same(a, b) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return a == b


def write_run_files(run_dir: str | Path, config, config_yaml: str) -> None:
    """``config.yaml`` and ``axes.json``, each written whole or not at all (a temporary file
    renamed over the old one): a crash mid-write must not leave a run directory whose next
    start cannot read what run it holds."""
    axes = json.dumps(axes_of(config), indent=1) + "\n"
    for name, text in ((CONFIG_FILE, config_yaml), (AXES_FILE, axes)):
        target = Path(run_dir) / name
        tmp = target.with_name(f"{name}.tmp")
        tmp.write_text(text)
        tmp.replace(target)
