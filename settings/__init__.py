"""What a setting is and how one is refused: the one error, the rules a section checks its keys
with, and the base every section derives from.

A *section* is a dataclass of the settings one part of the program reads (``model``, ``data``,
``parallel``, ``checkpoint``, ``optim.muon``, ...), defined in the module of that part, which
reads it directly. It checks its own keys in :meth:`Section.check`, in one style, with these
rules and this error:

- alone, when it is built (Hydra composing the config, or Python constructing it), so that a
  value that can never work is refused before anything else happens;
- with the whole run (a :class:`Run`: every section and the world size), when a run starts
  (``training.checks.check_config`` asks every section), for the rules that bound one
  section's key by another's (``loss.goldfish_h`` below ``data.seq_len``).

Before any range rule, one rule for every float wherever it sits, since a comparison with NaN is
always false: finite (:func:`check_finite`, run on the composed config before the sections are
built, and again when the run starts).

This package is the lowest floor, beside ``xielu``: ``model`` and ``data`` raise the same
:class:`ConfigError` as ``training``, and it imports nothing of the project.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work, found before the run starts; the message names the key."""


@dataclass(frozen=True)
class Run:
    """What a section may check its keys against when a run starts: the whole configuration
    (``training.config.ExperimentConfig``) and the number of processes."""

    config: Any
    world_size: int = 1


class Section:
    """The base of every section: its keys are checked when it is built and when a run starts.

    A section overrides :meth:`check`; ``run`` is None when it is built, the run when it starts.
    ``dataclasses.replace`` builds anew, so a replaced value is checked too."""

    def __post_init__(self) -> None:
        self.check()

    def check(self, run: Run | None = None) -> None:
        """Raise ConfigError naming the first key that cannot work."""


def refused(key: str, rule: str, value: Any, why: str = "") -> ConfigError:
    """``key must be <rule> (<why>), got <value>``: every range rule's message."""
    because = f" ({why})" if why else ""
    return ConfigError(f"{key} must be {rule}{because}, got {value}")


def one_of(key: str, value: Any, choices: Iterable[Any]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, choices))}")


def at_least(key: str, value: Any, minimum: int | float, why: str = "") -> None:
    """``value >= minimum`` (``positive`` in the message when the minimum is 1); written so that
    NaN is refused too (every comparison with it is false)."""
    if not value >= minimum:
        raise refused(key, "positive" if minimum == 1 else f">= {minimum}", value, why)


def positive(key: str, value: Any, why: str = "") -> None:
    """``value > 0`` for a float (NaN refused)."""
    if not value > 0:
        raise refused(key, "positive", value, why)


def fraction(key: str, value: Any, why: str = "") -> None:
    """``0 <= value < 1``: a decay rate or a momentum."""
    if not 0 <= value < 1:
        raise ConfigError(f"{key}={value} must lie in [0, 1){f' ({why})' if why else ''}")


def sections(node: object) -> Iterator[Section]:
    """Every section in ``node``, outer ones first (``optim``, then ``optim.ademamix``), and the
    sections inside lists (a mixture's sources)."""
    if isinstance(node, Section):
        yield node
    if is_dataclass(node):
        for f in fields(node):
            yield from sections(getattr(node, f.name))
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from sections(item)


def non_finite_settings(node: object, key: str = "") -> Iterator[tuple[str, float]]:
    """``(dotted key, value)`` of every float in ``node`` that is not a finite number, however
    deep: dataclass fields, list and tuple items (``data.sources[0].weight``, ``optim.betas[1]``)
    and mapping values (``model.activation_kwargs.alpha_p_init``).

    One rule for every float setting, because a range check cannot be trusted with them: every
    comparison with NaN is false, so ``x < 0`` lets it through, and infinity is above any
    bound. Both then reached the run (a NaN loss at step 1, a mixture source taking every token).
    """
    if isinstance(node, float):
        if not math.isfinite(node):
            yield key, node
    elif is_dataclass(node):
        for f in fields(node):
            yield from non_finite_settings(getattr(node, f.name), f"{key}.{f.name}".lstrip("."))
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from non_finite_settings(item, f"{key}[{i}]")
    elif isinstance(node, dict):
        for name, item in node.items():
            yield from non_finite_settings(item, f"{key}.{name}".lstrip("."))


def check_finite(config: Any) -> None:
    """Refuse the first float setting that is NaN or infinite, naming its key."""
    for key, value in non_finite_settings(config):
        raise ConfigError(f"{key} must be a finite number, got {value}")
