"""Which settings a resume may change, and the refusal, naming each, when a fixed one changed.

Rerunning a command resumes the run in its ``trainer.run_dir``: that is how a requeued job goes
on. A start whose settings differ from those the newest checkpoint was trained with either
continues the same run with a new setting (a longer run, another learning-rate cooldown, more
data workers: the config wins, as for the optimizer's settings) or would silently turn the run
into another experiment (another width, another corpus, another tokenizer). The second kind is
refused before anything in the run directory is touched, each key named with the run's value
and the command line's.

The rule, one list (docs/training.md, "What a resume may change"):

- every key of :data:`FIXED_SECTIONS` may not change, except those in :data:`MAY_CHANGE`;
- every key of :data:`FIXED_KEYS` and of ``trainer.axes`` may not change (the axes: what
  makes two runs of a sweep different), and with ``optim.lr`` the optimizer's tuned rate
  (``OptimConfig.tuned_rate``: ``optim.muon.lr`` under Muon);
- every other key may change, and the new value is what runs from the resumed step on;
- ``trainer.allow_changes`` names fixed keys this start changes on purpose (``data.paths``
  after moving the files); the load still stops if the checkpoint then does not fit.

The checkpoint compared with is the one the resume would load: each checkpoint holds the
``config.yaml`` of the run that wrote it.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import ConfigError

if TYPE_CHECKING:  # the package is imported while training.config is (its sections)
    from training.config import ExperimentConfig

# sections whose every key is fixed for the life of a run, and why
FIXED_SECTIONS = {
    "model": "the weights' shapes and what they compute",
    "data": "what the run reads, in which order, through which tokenizer",
}
# keys of other sections that a resume may not change either, and why
FIXED_KEYS = {
    "optim.name": "the optimizer's state is that optimizer's (AdEMAMix keeps a slow moment)",
    "checkpoint.initial_hf": "the published weights the run started from: another is another run",
}
# keys of those sections that a resume may change all the same, and why
MAY_CHANGE = {
    "model.loss_chunk_tokens": "how the loss is cut into pieces in memory, not what it computes",
    "model.attention": "which kernel keeps attention within documents, not what it computes",
    "model.activation_kwargs.backend": "which kernel computes the activation, not what it is",
    "data.num_workers": "the data position is re-partitioned over the new workers",
    "data.hub_retries": "how often a failing read from the Hub is retried",
    "data.hub_backoff_s": "how long a retry of the Hub waits",
    "data.cache_dir": "where the builtin corpus is cached",
}


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` for every leaf of a config dataclass (lists as lists), the
    activation's options each its own key (``model.activation_kwargs.backend``); an empty
    mapping has no leaf, so an option added is the one key that changed."""
    node = asdict(config) if is_dataclass(config) else config
    out: dict[str, Any] = {}
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = list(value) if isinstance(value, tuple) else value
    return out


def is_fixed(key: str, axes: list[str]) -> bool:
    """Whether a resume may not change ``key`` (the module doc's rule, without the escape)."""
    if key in axes or key in FIXED_KEYS:
        return True
    return key.split(".")[0] in FIXED_SECTIONS and key not in MAY_CHANGE


def fixed_changes(saved: ExperimentConfig, ours: ExperimentConfig) -> list[tuple[str, Any, Any]]:
    """(key, the run's value, this start's value) for every fixed key that differs."""
    before, after = flatten(saved), flatten(ours)
    allowed = set(ours.trainer.allow_changes)
    # the optimizer's tuned rate (optim.muon.lr under Muon) is an axis wherever optim.lr is
    axes = list(ours.trainer.axes)
    if "optim.lr" in axes:
        axes.append(ours.optim.tuned_rate)
    changes = []
    for key in sorted(before.keys() | after.keys()):
        # a key allowed, or a mapping above it (model.activation_kwargs: every option)
        if any(key == a or key.startswith(a + ".") for a in allowed) or not is_fixed(key, axes):
            continue
        old, new = before.get(key), after.get(key)
        if not _same(old, new):
            changes.append((key, old, new))
    return changes


def refuse_fixed_changes(saved: ExperimentConfig, ours: ExperimentConfig, where: Path) -> None:
    """Raise ConfigError naming every fixed key this start changes against ``where`` (the
    ``config.yaml`` of the checkpoint a resume would load)."""
    changes = fixed_changes(saved, ours)
    if not changes:
        return
    listing = "\n".join(f"  {key}: {old!r} in the run, {new!r} now" for key, old, new in changes)
    keys = ",".join(key for key, _, _ in changes)
    run_dir = where.parent.parent.parent
    raise ConfigError(
        f"{run_dir} holds a run that this start would change in what a resume may not change "
        f"(docs/training.md, 'What a resume may change'; the run's values are those of "
        f"{where}):\n{listing}\nNothing was changed. Rerun the command that started the run, "
        "give this one its own trainer.run_dir, or, to change it on purpose, add "
        f"trainer.allow_changes=[{keys}]."
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b
