"""The optimizer's state on disk by parameter name, so that no world size or layout is baked in.

torch keeps an optimizer's param groups as a list, and how many groups a run has depends on
where it runs: under bf16 FSDP2 a role's group is split by layout (whole parameters and DTensor
shards, ``training.optim``), so 2 processes have more groups than 1. A checkpoint that saved
its groups by index could not be loaded by another world size ("Missing key ...
param_groups.3.weight_decay"). Saved flattened instead (DCP's ``flatten_optimizer_state_dict``),
every value is keyed by the parameter's name: ``optim.state.<name>.exp_avg`` for the moments
(the same keys as the by-index format used for them) and ``optim.param_groups.<name>.<setting>``
for the settings.

On load, only the moments come from the checkpoint. The groups, and every setting in them, are
the ones this run built from its config: the config says what runs (docs/training.md, "What a
resume may change"). The checkpoint's settings are read only to tell the user what the config
changed (:func:`changed_settings`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from training.checkpoint.layout import single_process_is_intended
from training.checkpoint.unpickling import dcp_load, read_metadata

BY_NAME = StateDictOptions(flatten_optimizer_state_dict=True)
MOMENTS, SETTINGS = "state.", "param_groups."
SAVED_SETTINGS = f"optim.{SETTINGS}"
# set by the schedule at every step, or how the update is computed rather than what it is
NOT_A_SETTING = ("lr", "params", "foreach", "fused", "capturable", "differentiable")


def state_to_save(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What DCP writes: the model's state and the optimizer's, keyed by parameter name."""
    model_state, optim_state = get_state_dict(model, optimizer, options=BY_NAME)
    return {"model": model_state, "optim": optim_state}


def load_template(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(what to read from a checkpoint, this run's own settings by name). The first holds the
    model's tensors and the optimizer's moments, which DCP fills in place; the second goes back
    in with them (:func:`restore`)."""
    model_state, optim_state = get_state_dict(model, optimizer, options=BY_NAME)
    moments = {k: v for k, v in optim_state.items() if k.startswith(MOMENTS)}
    own_settings = {k: v for k, v in optim_state.items() if k.startswith(SETTINGS)}
    return {"model": model_state, "optim": moments}, own_settings


def restore(model, optimizer, state: dict, own_settings: dict) -> None:
    """The read tensors into the model and optimizer, with this run's settings in its groups."""
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict={**state["optim"], **own_settings},
        options=StateDictOptions(strict=True, flatten_optimizer_state_dict=True),
    )


def saved_settings(path: Path) -> dict[str, dict[str, Any]]:
    """``{parameter name: {setting: value}}`` as the checkpoint at ``path`` holds them, whether
    it keyed its groups by name or (before this module) by index. Every rank calls it (a DCP
    read is a collective)."""
    keys = [k for k in read_metadata(path).state_dict_metadata if k.startswith(SAVED_SETTINGS)]
    values: dict[str, Any] = dict.fromkeys(keys)
    if keys:
        with single_process_is_intended():
            dcp_load(values, path)
    by_index: dict[str, dict[str, Any]] = defaultdict(dict)
    by_name: dict[str, dict[str, Any]] = defaultdict(dict)
    for key, value in values.items():
        owner, _, setting = key[len(SAVED_SETTINGS) :].rpartition(".")
        (by_index if owner.isdigit() else by_name)[owner][setting] = value
    for group in by_index.values():  # the older format: a group lists its parameters' names
        for name in group.get("params", []):
            by_name[name].update(group)
    return dict(by_name)


def own_settings_by_name(own_settings: dict) -> dict[str, dict[str, Any]]:
    """:func:`load_template`'s flat settings as ``{parameter name: {setting: value}}``."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for key, value in own_settings.items():
        name, _, setting = key[len(SETTINGS) :].rpartition(".")
        out[name][setting] = value
    return dict(out)


def changed_settings(saved: dict[str, dict], ours: dict[str, dict]) -> list[str]:
    """One line per setting the config changed against the checkpoint, with how many
    parameters it concerns (``weight_decay 0.1 -> 0.05 for 12 of 30 parameters``)."""
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for name, settings in ours.items():
        before = saved.get(name, {})
        for setting, value in settings.items():
            if setting in NOT_A_SETTING or setting not in before:
                continue
            old, new = _plain(before[setting]), _plain(value)
            if old != new:
                counts[(setting, repr(old), repr(new))] += 1
    return [
        f"{setting} {old} -> {new} for {n} of {len(ours)} parameters"
        for (setting, old, new), n in sorted(counts.items())
    ]


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
