"""``builtin``: an offline smoke-test corpus from documentation that ships with the interpreter.

Documents: every pydoc topic (the language reference sections behind ``help()``), and every
standard-library module's docstrings (module, classes, functions), read with ``ast`` from the
source files so nothing is imported. About a megabyte of English technical prose: enough for
``python train.py`` to train and evaluate a tiny model end to end with no network. It is NOT a
pretraining corpus; results on it say nothing about the paper's claims. Built once, cached as
jsonl, and read like local files (``data.text``).
"""

from __future__ import annotations

import ast
import collections
import json
import os
import random
import sys
import sysconfig
from pathlib import Path

from data.config import DataConfig
from data.text import TextSource, text_file_source

MIN_CHARS = 200


def _pydoc_topics() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [topics[name].strip() for name in sorted(topics)]


def _statements(tree: ast.Module):
    """The nodes that can hold a definition, in ``ast.walk``'s breadth-first order (the
    corpus's order of documents): ``ast.walk`` itself visits every expression too, twice the
    time of building the corpus."""
    holders = (ast.stmt, ast.excepthandler, ast.match_case)
    queue = collections.deque([tree])
    while queue:
        node = queue.popleft()
        queue.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, holders))
        yield node


def _module_docstrings(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    parts = [ast.get_docstring(tree) or ""]
    for node in _statements(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and not node.name.startswith("_"):
                parts.append(f"{node.name}: {doc}")
    return "\n\n".join(p.strip() for p in parts if p.strip())


def _stdlib_documents() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3")
    docs = []
    for path in sorted(root.rglob("*.py")):
        if any(part in skip for part in path.relative_to(root).parts):
            continue
        text = _module_docstrings(path)
        if text:
            docs.append(text)
    return docs


def build_documents(part: str = "all") -> list[str]:
    """All documents of ``part`` (``data.builtin_part``), in a fixed shuffled order: language-
    reference topics and module docstrings differ in style, and a stream that switched from
    one to the other halfway would show that switch in the loss curve."""
    reference = _pydoc_topics() if part in ("all", "reference") else []
    docstrings = _stdlib_documents() if part in ("all", "docstrings") else []
    docs = [d for d in reference + docstrings if len(d) >= MIN_CHARS]
    random.Random(0).shuffle(docs)
    return docs


def builtin_corpus_path(cache_dir: str | None = None, part: str = "all") -> Path:
    """The corpus (or one part of it) as jsonl, built on first use and cached (per Python
    version)."""
    cache = Path(cache_dir or os.environ.get("XIELU_CACHE", "~/.cache/xielu-llm")).expanduser()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    suffix = "" if part == "all" else f"_{part}"
    path = cache / f"builtin_corpus_v2_py{version}{suffix}.jsonl"
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as out:
        for doc in build_documents(part):
            out.write(json.dumps({"text": doc}) + "\n")
    tmp.replace(path)  # atomic: concurrent ranks never read a half-written file
    return path


def open_corpus(config: DataConfig) -> TextSource:
    """The cached corpus (built on first use); ``text_column`` and ``min_int_score`` do not
    apply to it."""
    return TextSource([str(builtin_corpus_path(config.cache_dir, config.builtin_part))])


SOURCE = text_file_source(
    "builtin",
    "offline smoke-test corpus (the Python docs), built and cached on first use",
    open_corpus,
)
