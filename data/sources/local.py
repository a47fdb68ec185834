"""``local``: parquet / jsonl(.gz) files in the FineWeb-Edu schema, for nodes without internet.

Reading, bad data and fragments: ``data.text_files``; sharding, hold-out and resume:
``data.stream``.
"""

from __future__ import annotations

from data.config import DataConfig
from data.registry import DataSource, register
from data.stream import TextStream, pretokenize_chunks, repartition, validation_windows
from data.text_files import TextSource


def open_files(config: DataConfig) -> TextSource:
    return TextSource(config.paths, config.text_column, config.min_int_score)


register(
    DataSource(
        name="local",
        summary="local parquet / jsonl(.gz) files (data.paths globs)",
        training=TextStream,
        validation=validation_windows,
        pretokenize=pretokenize_chunks,
        repartition=repartition,
        open_text=open_files,
        needs_paths=True,
    )
)
