"""The text the tests read, made by the tests: real prose from the builtin corpus (it ships with
the interpreter) as FineWeb-Edu-schema parquet and as C4-layout gzipped JSON lines.

The optional real samples in ``../shared/data`` (FineWeb-Edu, C4, benchmark excerpts) are read
only by tests marked ``shared_data``, which skip with their reason where that folder is absent
(a user's clone): ``tests/conftest.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# ../shared beside the repository; found by walking up, so that a copy of tests/ one level
# deeper (mutation testing's mutants/) finds it too. Read by tests marked shared_data only.
SHARED = next(
    (p / "shared" / "data" for p in Path(__file__).resolve().parents if (p / "shared").is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "data",
)

DOCUMENTS = 320  # paragraphs: the size the tokenizer and reader tests were written for
MIN_CHARS = 40


def real_documents() -> list[str]:
    """Paragraph-sized documents of real English prose: the language-reference topics of the
    builtin corpus (``data.sources.builtin``), split at blank lines, whitespace collapsed (so a
    whitespace-normalising tokenizer round-trips them), no two alike, in the corpus's order. Raises
    when the interpreter ships too few of them: a test on an empty corpus would pass for
    nothing."""
    from data.sources.builtin import build_documents

    paragraphs = (
        " ".join(p.split()) for d in build_documents("reference") for p in d.split("\n\n")
    )
    # none that begins or ends like an earlier one: the reference repeats some paragraphs and
    # some templates ('It is a "SyntaxError" to use ...'), and the pipeline tests tell windows,
    # which span documents' ends and starts, apart by their tokens
    docs, seen = [], set()
    for p in paragraphs:
        ends = {("start", p[:MIN_CHARS]), ("end", p[-MIN_CHARS:])}
        if len(p) > MIN_CHARS and not ends & seen:
            docs.append(p)
            seen |= ends
    docs = docs[:DOCUMENTS]
    if len(docs) < DOCUMENTS:
        raise RuntimeError(
            f"the builtin corpus's reference part gave {len(docs)} paragraphs of over "
            f"{MIN_CHARS} characters, not {DOCUMENTS}: this interpreter ships no pydoc topics "
            "(pydoc_data), which the tests' real text comes from"
        )
    return docs


def shared_documents() -> list[str]:
    """The real FineWeb-Edu and C4 samples of ../shared/data, split into paragraph-sized
    documents (tests marked ``shared_data`` only)."""
    docs = [p.read_text() for p in sorted((SHARED / "fineweb_edu").glob("*.txt"))]
    for path in sorted((SHARED / "c4").glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            docs.extend(json.loads(line)["text"] for line in f)
    paragraphs = [p.strip() for d in docs for p in d.split("\n")]
    return [p for p in paragraphs if len(p) > MIN_CHARS]


def fineweb_table(texts: list[str], offset: int = 0) -> pa.Table:
    """``texts`` as rows of FineWeb-Edu's schema (the dataset card's columns, in its order)."""
    n = len(texts)
    return pa.table(
        {
            "text": texts,
            "id": [f"<urn:uuid:{offset + i}>" for i in range(n)],
            "dump": ["CC-MAIN-2024-10"] * n,
            "url": [f"https://example.org/{offset + i}" for i in range(n)],
            "date": ["2024-02-21T10:00:00Z"] * n,
            "file_path": [
                f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/{offset + i}" for i in range(n)
            ],
            "language": ["en"] * n,
            "language_score": [0.95] * n,
            "token_count": [len(t.split()) for t in texts],
            "score": [2.5 + ((offset + i) % 3) * 0.5 for i in range(n)],
            "int_score": [2 + (offset + i) % 3 for i in range(n)],
        }
    )


def _spread(docs: list[str], files: int):
    """(file index, index of its first document, its documents): ``docs`` in order over
    ``files`` files of equal size but the last."""
    per_file = -(-len(docs) // files)
    for i in range(files):
        yield i, i * per_file, docs[i * per_file : (i + 1) * per_file]


def write_parquet_corpus(directory: Path, files: int = 3, row_group_size: int = 20) -> list[str]:
    """The real documents spread over ``files`` parquet files of several row groups each."""
    docs = real_documents()
    directory.mkdir(parents=True, exist_ok=True)
    for i, offset, chunk in _spread(docs, files):
        table = fineweb_table(chunk, offset=offset)
        pq.write_table(table, directory / f"part_{i:03d}.parquet", row_group_size=row_group_size)
    return docs


def write_c4_corpus(directory: Path, files: int = 3) -> list[str]:
    """The real documents as C4's published files: ``c4-train.NNNNN-of-01024.json.gz``, one
    JSON object a line with ``text``, ``timestamp`` and ``url``."""
    docs = real_documents()
    directory.mkdir(parents=True, exist_ok=True)
    for i, offset, chunk in _spread(docs, files):
        with gzip.open(directory / f"c4-train.{i:05d}-of-01024.json.gz", "wt") as f:
            for j, text in enumerate(chunk):
                record = {
                    "text": text,
                    "timestamp": "2019-04-25T12:57:54Z",
                    "url": f"https://example.org/{offset + j}",
                }
                f.write(json.dumps(record) + "\n")
    return docs


def made_once(name: str, write: Callable[[Path], object]) -> Path:
    """``write(directory)``'s output in a directory of this machine's temporary folder, made by
    the first test process that asks and reused by the others (the end-to-end tier's cases name
    these paths in their overrides at import time, before any fixture). The content is a
    function of the writer's module, the builtin corpus's and the interpreter alone, all in the
    folder's name, so a process that loses the race drops its own copy and a changed writer
    makes a new folder."""
    from data.sources import builtin

    code = b"".join(Path(inspect.getsourcefile(m)).read_bytes() for m in (write, builtin))
    code += sys.version.encode()
    name = f"{name}-{hashlib.sha256(code).hexdigest()[:12]}"
    final = Path(tempfile.gettempdir()) / f"xielu-tests-{os.getuid()}" / name
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{name}-"))
    write(scratch)
    try:
        scratch.rename(final)
    except OSError:  # another process made it first
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def c4_corpus() -> Path:
    """A folder of C4-layout files of real text, made once (``made_once``)."""
    return made_once("c4", write_c4_corpus)
