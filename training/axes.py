"""The files that say which run a run directory holds: ``config.yaml`` and ``axes.json``.

The trainer resumes whatever checkpoint its ``trainer.run_dir`` holds: that is what makes a
requeued SLURM job go on where it stopped. It is also how a grid over learning rates that put
every job in one directory would have each later job resume the first one's final checkpoint
and train zero steps. So the keys of ``trainer.axes`` (the default ones plus whatever a sweep
varies) may not change on a resume (``training.resume_rules`` refuses, against the config each
checkpoint holds), and each run writes their values to ``axes.json`` beside ``config.yaml``,
for people and scripts to read which run a directory holds. Both are written only once a start
has passed every check, each whole or not at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.checkpoint.layout import CONFIG_FILE
from training.config import config_value

AXES_FILE = "axes.json"


def axes_of(config) -> dict:
    """``{key: value}`` for every key of ``trainer.axes``, with JSON-friendly values."""
    return {key: _plain(config_value(config, key)) for key in config.trainer.axes}


def _plain(value):
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


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
