"""One place that maps the name in ``data.source=...`` to what the source yields.

Every module of the ``data.sources`` package registers exactly one :class:`DataSource`, named
like the module, when it is imported; the registry imports them all on first lookup. Adding a
source is therefore one module ``data/sources/<name>.py`` that calls ``register(...)`` and one
Hydra preset ``configs/data/<name>.yaml`` that sets ``source: <name>``; no other list of the
sources exists (``DataConfig``, the loaders and ``scripts/pretokenize.py`` all look them up
here). A source's own settings are fields of the shared ``DataConfig`` (``data.config`` says
why). The recipe: docs/extending.md.

Imports nothing of ``data``: ``data.config`` looks a source up to check its name, and every
source takes a config, so the config is written ``Config`` here rather than imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch.utils.data import IterableDataset

Config = Any  # a ``data.config.DataConfig``


class DataError(ValueError):
    """The data cannot feed the run as configured (no training document after the held-out
    ones, files changed since the checkpoint): what a source raises, at the latest when its
    first window is drawn, which the trainer does before it writes anything. The message names
    the setting and what to do; raised in a DataLoader worker, it reaches the main process with
    the worker's traceback around it (``data.loader.first_batch`` takes it off)."""


Window = dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class DataSource:
    """A registered data source.

    Attributes:
        name: the value of ``data.source``.
        summary: one line for listings and error messages.
        training: ``(config, rank, world_size)`` -> this rank's endless, resumable training
            windows; a ``data.resumable.ResumableStream`` that splits itself over DataLoader
            workers.
        validation: ``config`` -> every window of the held-out ``validation_documents``
            documents, in order, the last one padded (``data.validation.held_out_windows``);
            the loader shares them out to the ranks.
        pretokenize: ``(config, workers)`` -> every document (held-out ones included), tokenized
            as ``[BOS] ids EOS``, in order, as ``(tokens, counters)`` chunks; ``None`` for a
            source that cannot be pretokenized (it already is).
        needs_paths: ``data.paths`` must list files.
        reads_paths: ``data.paths`` is read when given (``needs_paths`` implies it): a source
            that reads none refuses a mixture entry's ``paths`` rather than ignore it.
        path_suffixes: the kinds of file ``data.paths`` may match (``.parquet``, ``.bin``...);
            each pattern must match one before a run starts (``DataConfig.check_inputs``).
        check: ``config`` -> None, raising ValueError naming the key when the files cannot be
            read as configured (a text column the first record lacks); run before a run
            starts (``DataConfig.check_inputs``). None: nothing to check.
        check_tokenizer: ``(config, tokenizer)`` -> None, raising ValueError naming both when
            the data was written by another tokenizer (token shards); None: the source
            tokenizes as it reads.
        repartition: ``(config, old states, n_new)`` -> the states of ``n_new`` streams that
            go on from the ``old`` streams' (one per old stream, in stream order; None: never
            ran), by the rule of ``data.repartition``: a resume on another world size or
            number of workers. ``None``: the source cannot (``data.restore.restore_loader``
            refuses); it may also raise ``CannotRepartitionError`` to say why.
    """

    name: str
    summary: str
    training: Callable[[Config, int, int], IterableDataset]
    validation: Callable[[Config], Iterator[Window]]
    pretokenize: Callable[[Config, int], Iterator[tuple[np.ndarray, Counter]]] | None = None
    needs_paths: bool = False
    reads_paths: bool = False
    path_suffixes: tuple[str, ...] = ()
    check: Callable[[Config], None] | None = None
    check_tokenizer: Callable[[Config, Any], None] | None = None
    repartition: Callable[[Config, list[dict | None], int], list[dict | None]] | None = None


_REGISTRY: dict[str, DataSource] = {}
_discovered = False


def register(source: DataSource) -> None:
    if source.name in _REGISTRY:
        raise ValueError(f"data source {source.name!r} is registered twice")
    _REGISTRY[source.name] = source


def _discover() -> None:
    """Import every module of ``data.sources``; each registers its source on import."""
    global _discovered
    if _discovered:
        return
    import data.sources as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    _discovered = True


def available_sources() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_source(name: str) -> DataSource:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"data.source={name!r} is not known; choose one of: {', '.join(available_sources())}"
        ) from None
