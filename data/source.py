"""What a data source is: the functions behind a name of ``data.source=...``, and the error
a source raises when its data cannot feed the run.

The sources themselves, by name, are the table in ``data/sources/__init__.py``. Imports only
``data.paths``, so that every module of the pipeline can name these types; a source takes a
config, written ``Config`` here rather than imported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from data.paths import expand_paths

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
    """A data source.

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
            each pattern must match one before a run starts (``check_inputs``).
        check: ``config`` -> None, raising ValueError naming the key when the files cannot be
            read as configured (a text column the first record lacks); run before a run
            starts (``check_inputs``). None: nothing to check.
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

    def check_inputs(self, config: Config) -> None:
        """The files ``data.paths`` names exist (each pattern matches at least one file of this
        source's kinds) and can be read as configured (``check``: a text column the first
        record lacks). Raises ValueError naming the key."""
        for pattern in config.paths if self.path_suffixes else ():
            try:
                expand_paths([pattern], self.path_suffixes)
            except FileNotFoundError as error:
                raise ValueError(str(error)) from None
        if self.check is not None:
            self.check(config)
