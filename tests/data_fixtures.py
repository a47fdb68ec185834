"""Small real-text corpora written to temporary files, in the FineWeb-Edu schema."""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# ../shared beside the repository; found by walking up, so that a copy of tests/ one level
# deeper (mutation testing's mutants/) finds it too
SHARED = next(
    (p / "shared" / "data" for p in Path(__file__).resolve().parents if (p / "shared").is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "data",
)


def real_documents() -> list[str]:
    """The FineWeb-Edu and C4 samples of ../shared/data, split into paragraph-sized documents."""
    docs = [Path(p).read_text() for p in sorted(glob.glob(str(SHARED / "fineweb_edu" / "*.txt")))]
    for path in sorted(glob.glob(str(SHARED / "c4" / "*.json.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            docs.extend(json.loads(line)["text"] for line in f)
    paragraphs = [p.strip() for d in docs for p in d.split("\n")]
    return [p for p in paragraphs if len(p) > 40]


def fineweb_table(texts: list[str], offset: int = 0) -> pa.Table:
    n = len(texts)
    return pa.table(
        {
            "text": texts,
            "id": [f"<urn:uuid:{offset + i}>" for i in range(n)],
            "dump": ["CC-MAIN-2024-10"] * n,
            "url": [f"https://example.org/{offset + i}" for i in range(n)],
            "language": ["en"] * n,
            "language_score": [0.95] * n,
            "token_count": [len(t.split()) for t in texts],
            "score": [2.5 + (i % 3) * 0.5 for i in range(n)],
            "int_score": [2 + (i % 3) for i in range(n)],
        }
    )


def write_parquet_corpus(directory: Path, files: int = 3, row_group_size: int = 20) -> list[str]:
    """The real documents spread over ``files`` parquet files of several row groups each."""
    docs = real_documents()
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(docs) // files)
    for i in range(files):
        chunk = docs[i * per_file : (i + 1) * per_file]
        table = fineweb_table(chunk, offset=i * per_file)
        pq.write_table(table, directory / f"part_{i:03d}.parquet", row_group_size=row_group_size)
    return docs
