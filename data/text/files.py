"""Documents from local files, in a fixed global order, readable from any (fragment, row).

A *fragment* is the unit a stream can be positioned in: one parquet row group, or one whole
jsonl(.gz) file. Fragments are ordered by sorted file path, then row group, so every process
agrees on the global document order without talking to the others.

Bad data never stops a run halfway without a message: an unreadable file or row group is skipped
with a warning; a record that is not valid UTF-8 or JSON, lacks the text field, or holds a
non-string is a bad record, and so is text with no UTF-8 encoding (``data.documents``, the rule
every source applies); an empty or whitespace-only document is an empty document. Reading
names each skipped record's counter instead of counting it, so that the caller can count each
record once however many streams read it (``data.text.stream``). A parquet file without the text
column is a configuration error and stops at once, naming it.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from data.config import DataConfig
from data.documents import document_text
from data.paths import expand_paths, fingerprint, listing

log = logging.getLogger(__name__)
# the unreadable files already named by this process (each is still skipped, and counted)
_SAID_UNREADABLE: set[str] = set()

TEXT_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json.gz", ".json")

# (row, text, skipped): text is a document, or None and skipped names the counter for the record
Record = tuple[int, str | None, str | None]


@dataclass(frozen=True)
class Fragment:
    path: str
    row_group: int  # -1: the whole (jsonl) file


class TextSource:
    """Local parquet / jsonl(.gz) documents: the ``local`` and ``builtin`` sources."""

    def __init__(
        self, patterns: list[str], text_column: str = "text", min_int_score: int | None = None
    ) -> None:
        self.files = expand_paths(patterns, TEXT_SUFFIXES)
        self.text_column = text_column
        self.min_int_score = min_int_score
        self.unreadable: list[int] = []  # indices into files: parquet files with no readable footer
        self.fragments = self._fragments()
        self.listing = listing(self.files)  # each file's name and size, read once
        self.fingerprint = fingerprint(self.listing, f"{text_column}:{min_int_score}")

    def _fragments(self) -> list[Fragment]:
        import pyarrow.parquet as pq

        out, first_record_checked = [], False
        for index, path in enumerate(self.files):
            if not path.endswith(".parquet"):
                if not first_record_checked:
                    first_record_checked = self._check_first_record(path)
                out.append(Fragment(path, -1))
                continue
            try:
                meta = pq.ParquetFile(path).metadata
            except Exception as error:  # truncated or not parquet at all
                if path not in _SAID_UNREADABLE:  # every reader of the list finds it
                    _SAID_UNREADABLE.add(path)
                    log.warning("skipping unreadable parquet file %s: %s", path, error)
                self.unreadable.append(index)
                continue
            names = meta.schema.names
            if self.text_column not in names:
                raise ValueError(
                    f"{path} has no column {self.text_column!r} (data.text_column); "
                    f"its columns: {', '.join(names)}"
                )
            out.extend(Fragment(path, i) for i in range(meta.num_row_groups))
        return out

    def _check_first_record(self, path: str) -> bool:
        """The first record of a jsonl file has ``data.text_column`` (a parquet file's schema
        says so for all of it): a name that is wrong for every record stops here, rather than
        as "no training document" or an empty validation set. False when the file has no
        readable record to tell."""
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rb") as lines:
                for line in lines:
                    if line.strip():
                        record = json.loads(line.decode("utf-8"))
                        break
                else:
                    return False
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError):
            return False  # damaged: skipped and counted when read
        if not isinstance(record, dict):
            return False
        if self.text_column not in record:
            raise ValueError(
                f"{path}: its first record has no {self.text_column!r} (data.text_column); "
                f"its keys: {', '.join(map(str, record))}"
            )
        return True

    def records(self, fragment: Fragment, start: int = 0) -> Iterator[Record]:
        """Every record from row ``start`` on. A file that stops early (truncated, unreadable
        row group) ends its records with ``(next row, None, "bad_files")`` after a warning."""
        row = start
        try:
            if fragment.row_group >= 0:
                records = self._read_parquet(fragment, start)
            else:
                records = self._read_jsonl(fragment.path, start)
            for record in records:
                row = record[0] + 1
                yield record
        except (OSError, EOFError, ValueError) as error:
            if isinstance(error, ValueError) and "has no column" in str(error):
                raise
            log.warning("stopped reading %s early: %s", fragment.path, error)
            yield row, None, "bad_files"

    def read(self, fragment: Fragment, start: int = 0) -> Iterator[tuple[int, str | None]]:
        """(row, text) from ``start`` on; text is None for a record that is skipped."""
        for row, text, skipped in self.records(fragment, start):
            if skipped != "bad_files":
                yield row, text

    def documents(self) -> Iterator[tuple[int, int, str]]:
        """(fragment index, row, text) of every document, in the global order."""
        for index, fragment in enumerate(self.fragments):
            for row, text, _ in self.records(fragment):
                if text is not None:
                    yield index, row, text

    def _keep(self, text, score) -> tuple[str | None, str | None]:
        text, skipped = document_text(text)
        if text is None:
            return None, skipped
        if self.min_int_score is not None and (score is None or score < self.min_int_score):
            return None, "filtered_documents"
        return text, None

    def _read_parquet(self, fragment: Fragment, start: int) -> Iterator[Record]:
        import pyarrow.parquet as pq

        columns = [self.text_column]
        if self.min_int_score is not None:
            columns.append("int_score")
        try:
            table = pq.ParquetFile(fragment.path).read_row_group(
                fragment.row_group, columns=columns
            )
        except Exception as error:
            raise OSError(f"row group {fragment.row_group}: {error}") from error
        texts = table.column(self.text_column).to_pylist()
        scores = table.column("int_score").to_pylist() if self.min_int_score is not None else None
        for row in range(start, len(texts)):
            yield row, *self._keep(texts[row], scores[row] if scores else None)

    def _read_jsonl(self, path: str, start: int) -> Iterator[Record]:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as lines:
            for row, line in enumerate(lines):
                if row < start:
                    continue
                if not line.strip():
                    yield row, None, "empty_documents"
                    continue
                try:
                    record = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    record = None
                if not isinstance(record, dict):
                    yield row, None, "bad_records"
                else:
                    yield row, *self._keep(record.get(self.text_column), record.get("int_score"))


def local_files(config: DataConfig) -> TextSource:
    """The files ``data.paths`` names, read as ``data.text_column`` and ``data.min_int_score``
    say: what a text stream reads unless its source opens other files (``builtin``)."""
    return TextSource(config.paths, config.text_column, config.min_int_score)
