"""``local``: parquet / jsonl(.gz) files in the FineWeb-Edu schema, for nodes without internet.

Reading, bad data and fragments: ``data.text.files``; sharding, hold-out and resume:
``data.text``.
"""

from data.text import local_files, text_file_source
from data.text.files import TEXT_SUFFIXES

SOURCE = text_file_source(
    "local",
    "local parquet / jsonl(.gz) files (data.paths globs)",
    local_files,
    needs_paths=True,
    path_suffixes=TEXT_SUFFIXES,
)
