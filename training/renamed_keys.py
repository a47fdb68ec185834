"""Settings that moved, in one table: an old key on the command line is refused naming its new
place, and a run directory written before the move is read through the same table.

The trainer's settings were once one flat ``trainer`` bag, the loss's and every optimizer's
knobs one flat ``optim`` bag; each now lives in the section of the part that reads it
(``training.config``). A command typed from memory, a script or a sweep file with an old key
stops with the new key; a run's saved ``config.yaml`` (each checkpoint holds one) is brought up
to date when it is read (:func:`upgrade`), so the run resumes, and evaluation and export read it.
"""

from __future__ import annotations

import copy
from typing import Any

from settings import ConfigError

# old dotted key -> its new place
RENAMED = {
    "data.document_ids": "data.document_mask",
    "trainer.parallelism": "parallel.strategy",
    **{
        f"trainer.{key}": f"parallel.{key}"
        for key in (
            "precision",
            "compile",
            "compile_backend",
            "activation_checkpointing",
            "float8",
            "float8_keep",
            "float8_auto_filter",
            "fsdp_reshard_after_forward",
            "fsdp_reduce_every_micro_batch",
            "collective_timeout_s",
        )
    },
    "trainer.checkpoint_every": "checkpoint.every",
    "trainer.async_checkpoint": "checkpoint.async_write",
    "trainer.keep_checkpoints": "checkpoint.keep",
    "trainer.eval_every": "validation.every",
    "trainer.eval_batches": "validation.batches",
    "trainer.downstream_every": "downstream.every",
    "trainer.downstream_tasks": "downstream.tasks",
    "trainer.downstream_limit": "downstream.limit",
    "trainer.downstream_data": "downstream.data",
    "trainer.max_bad_steps": "spikes.max_bad_steps",
    "trainer.spike_window": "spikes.window",
    "trainer.spike_threshold": "spikes.threshold",
    "trainer.spike_skip": "spikes.skip",
    "trainer.spike_skip_limit": "spikes.skip_limit",
    "trainer.profile_steps": "profile.steps",
    "optim.z_loss": "loss.z_loss",
    "optim.goldfish_k": "loss.goldfish_k",
    "optim.goldfish_h": "loss.goldfish_h",
    "optim.goldfish_rule": "loss.goldfish_rule",
    "optim.eod_mask_loss": "loss.eod_mask",
    "optim.ademamix_alpha": "optim.ademamix.alpha",
    "optim.ademamix_beta3": "optim.ademamix.beta3",
    "optim.ademamix_alpha_warmup": "optim.ademamix.alpha_warmup",
    "optim.ademamix_beta3_warmup": "optim.ademamix.beta3_warmup",
    "optim.muon_lr": "optim.muon.lr",
    "optim.muon_momentum": "optim.muon.momentum",
}
# keys removed; their values changed nothing a run produced (fault injection, now in tests/)
DROPPED = (
    "trainer.debug_nan_steps",
    "trainer.debug_crash_in_checkpoint_at",
    "trainer.debug_signal",
)
# switches that became choices, under their old keys: {old value: new value}
RENAMED_VALUES = {
    "trainer.compile": {True: "blocks", False: "none"},
    "trainer.activation_checkpointing": {True: "full", False: "none"},
}
# settings whose values are lists of keys, which may name renamed ones
KEY_LISTS = ("trainer.axes", "trainer.allow_changes")


def new_key(dotted: str) -> str | None:
    """The new place of a renamed key, or of a key inside one (``optim.muon_lr`` ->
    ``optim.muon.lr``); None for a key that was not renamed."""
    for old, new in RENAMED.items():
        if dotted == old or dotted.startswith((old + ".", old + "[")):
            return new + dotted[len(old) :]
    return None


def renamed_key_message(dotted: str) -> str | None:
    """The refusal of an old key, naming its new place; None for a key that was not renamed."""
    new = new_key(dotted)
    if new is None:
        return None
    return (
        f"{dotted} is now {new}: the settings live in the section of the part that reads them "
        "(training/renamed_keys.py lists every moved key)"
    )


def refuse_renamed(overrides: list[str]) -> None:
    """Raise ConfigError for the first command-line override (``key=value``, ``+key=value``,
    ``~key``) that names an old key; Hydra would otherwise stop with "not in struct"."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0].strip()
        message = renamed_key_message(key)
        if message:
            raise ConfigError(message)


def upgrade(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config (a run's ``config.yaml`` as a plain mapping) in today's layout: old
    values renamed under their old keys, dropped keys left out, then every renamed key moved
    to its new place, and the key lists (``trainer.axes``) renamed too. A copy."""
    saved = copy.deepcopy(saved)
    for key, values in RENAMED_VALUES.items():
        value = _get(saved, key)
        if isinstance(value, bool):
            _set(saved, key, values[value])
    for key in DROPPED:
        _pop(saved, key)
    for old, new in RENAMED.items():
        if _get(saved, old, _MISSING) is not _MISSING:
            _set(saved, new, _pop(saved, old))
    for key in KEY_LISTS:
        value = _get(saved, key)
        if isinstance(value, list):
            _set(saved, key, [new_key(item) or item for item in value])
    return saved


_MISSING = object()


def _get(node: dict, dotted: str, default: Any = None) -> Any:
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _set(node: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _pop(node: dict, dotted: str) -> Any:
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return node.pop(last, None) if isinstance(node, dict) else None
