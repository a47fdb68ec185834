"""The files ``data.paths`` names, and a fingerprint of them, for text files and token shards alike.

One place, so that the text sources and the ``tokenized`` source expand globs and fingerprint
their files the same way: a resume compares fingerprints, and two rules would refuse good data.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path


def expand_paths(patterns: list[str], suffixes: tuple[str, ...]) -> list[str]:
    """Sorted files matching the globs; an error naming the pattern when one matches nothing."""
    files: set[str] = set()
    for pattern in patterns:
        matched = [p for p in glob.glob(os.path.expanduser(pattern), recursive=True)]
        matched = [p for p in matched if os.path.isfile(p) and p.endswith(suffixes)]
        if not matched:
            raise FileNotFoundError(
                f"data.paths pattern {pattern!r} matches no {'/'.join(suffixes)} file"
            )
        files.update(os.path.abspath(p) for p in matched)
    return sorted(files)


def listing(files: list[str]) -> list[str]:
    """``name:size`` of each file: what :func:`fingerprint` hashes, kept in a data state so that
    a refused resume can say which file was added, removed or changed size
    (``data.resumable``)."""
    return [f"{Path(path).name}:{os.path.getsize(path)}" for path in files]


def fingerprint(listed: list[str], extra: str = "") -> str:
    """Identifies the data from its ``listing``: file names and sizes, not modification times."""
    digest = hashlib.sha256(extra.encode())
    for entry in listed:
        digest.update(f"{entry};".encode())
    return digest.hexdigest()[:16]
