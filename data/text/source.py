"""A text-file source, whole, from the one thing that tells it from another: its files' opener.

Every callable of the ``DataSource`` takes the opener as it was given here, so no part of a
text source looks its own files up by name in the table of sources.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from functools import partial

import torch

from data.config import DataConfig
from data.source import DataSource
from data.text.files import TextSource, local_files
from data.text.pretokenize import pretokenize_chunks
from data.text.repartition import repartition
from data.text.stream import TextStream
from data.validation import held_out_text_windows


def text_file_source(
    name: str,
    summary: str,
    open_files: Callable[[DataConfig], TextSource] = local_files,
    needs_paths: bool = False,
    path_suffixes: tuple[str, ...] = (),
) -> DataSource:
    """The ``DataSource`` of documents in the files ``open_files(config)`` returns."""
    return DataSource(
        name=name,
        summary=summary,
        training=partial(TextStream, open_files=open_files),
        validation=partial(validation_windows, open_files=open_files),
        pretokenize=partial(pretokenize_chunks, open_files=open_files),
        needs_paths=needs_paths,
        path_suffixes=path_suffixes,
        check=open_files if needs_paths else None,
        repartition=partial(repartition, open_files=open_files),
    )


def validation_windows(
    config: DataConfig, *, open_files: Callable[[DataConfig], TextSource] = local_files
) -> Iterator[dict[str, torch.Tensor]]:
    """The held-out documents: the first ``validation_documents`` in the files' order."""
    source = open_files(config)
    held = itertools.islice(source.documents(), config.validation_documents)
    yield from held_out_text_windows(config, (text for _, _, text in held))
