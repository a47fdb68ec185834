"""``builtin``: an offline smoke-test corpus built from the interpreter's own documentation.

See ``data.builtin_corpus``; read like local files (``data.stream``). Not a pretraining corpus.
"""

from __future__ import annotations

from data.builtin_corpus import builtin_corpus_path
from data.config import DataConfig
from data.registry import DataSource, register
from data.stream import TextStream, pretokenize_chunks, repartition, validation_windows
from data.text_files import TextSource


def open_corpus(config: DataConfig) -> TextSource:
    """The cached corpus (built on first use); ``text_column`` and ``min_int_score`` do not
    apply to it."""
    return TextSource([str(builtin_corpus_path(config.cache_dir))])


register(
    DataSource(
        name="builtin",
        summary="offline smoke-test corpus (the Python docs), built and cached on first use",
        training=TextStream,
        validation=validation_windows,
        pretokenize=pretokenize_chunks,
        repartition=repartition,
        open_text=open_corpus,
    )
)
