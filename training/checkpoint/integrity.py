"""Evidence that a checkpoint's bytes are damaged, recorded while it is written.

A checkpoint that fails to load is set aside only on evidence from its bytes: a file that is
missing, shorter or different from what was written, or metadata that cannot be read. A load
that fails on intact bytes (another model width, a library that reads the format differently)
says what differs and touches nothing (``training.checkpoint.load``).

``manifest.json`` in each checkpoint lists every file with its size and CRC-32, written last,
before the checkpoint is published. Each rank checksums the files it wrote itself (its DCP
shards ``__<rank>_*.distcp`` and its rank file; rank 0 also the rest), from the page cache,
and rank 0 writes the list. On load the ranks share the checking out between them, largest
files first, so a resume reads every byte once more, spread over every rank.

A checkpoint written before manifests existed still loads: then the evidence is what its own
metadata says (DCP's ``.metadata`` must be readable and every shard it names at least as long
as the bytes it places there; ``trainer.json`` must parse and record the step). The rank
files are checked where they are read (``training.checkpoint.load``).
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

from training.checkpoint.layout import RANK_FILES, TRAINER_FILE
from training.checkpoint.unpickling import read_metadata
from training.errors import DamagedCheckpointError, UnsafeCheckpointError
from training.runtime import distributed
from training.runtime.distributed import Env

MANIFEST_FILE = "manifest.json"
ALGORITHM = "crc32"
_CHUNK = 16 * 2**20
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_RANK_FILE = re.compile(r"^rank_(\d{5})\.pt$")


def checksum(path: Path) -> dict:
    """``{"size": bytes, "crc32": value}`` of one file, read in 16 MiB pieces."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while piece := f.read(_CHUNK):
            crc = zlib.crc32(piece, crc)
            size += len(piece)
    return {"size": size, ALGORITHM: crc}


def _writer_of(name: str) -> int:
    """The rank that wrote a file of a checkpoint (0 for the files only rank 0 writes)."""
    match = _SHARD.match(name) or _RANK_FILE.match(name)
    return int(match.group(1)) if match else 0


def checksum_own_files(directory: Path, rank: int) -> dict[str, dict]:
    """The checksums of the files ``rank`` wrote into ``directory`` (see the module doc)."""
    return {
        p.name: checksum(p)
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST_FILE and _writer_of(p.name) == rank
    }


def write_manifest(directory: Path, own: dict[str, dict], env: Env, flush) -> None:
    """Every rank hands in its own files' checksums; rank 0 writes them all, flushed to disk
    (``flush``: the writer's fsync) before the checkpoint is published."""
    every = distributed.gather_objects(own)
    if env.is_main:
        files = {name: entry for part in every for name, entry in part.items()}
        with open(directory / MANIFEST_FILE, "w") as f:
            json.dump({"algorithm": ALGORITHM, "files": dict(sorted(files.items()))}, f, indent=1)
            f.write("\n")
            flush(f)


def has_manifest(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file()


def verify(path: Path, env: Env) -> None:
    """Raise :class:`DamagedCheckpointError` naming the evidence when this rank's share of the
    checkpoint's files is not what was written. Every rank calls it; the caller makes them agree
    (``training.checkpoint.load``)."""
    if has_manifest(path):
        _verify_against_manifest(path, env)
    else:
        _verify_structure(path)


def _verify_against_manifest(path: Path, env: Env) -> None:
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        files = manifest["files"]
        algorithm = manifest["algorithm"]
    except (ValueError, KeyError, TypeError) as error:
        raise DamagedCheckpointError(f"{path / MANIFEST_FILE} cannot be read ({error})") from None
    if algorithm != ALGORITHM:
        raise DamagedCheckpointError(f"{path / MANIFEST_FILE}: unknown checksum {algorithm!r}")
    ordered = sorted(files, key=lambda name: (-files[name]["size"], name))
    for name in ordered[env.rank :: env.world_size]:
        expected, file = files[name], path / name
        if not file.is_file():
            raise DamagedCheckpointError(f"{file} is missing (the manifest lists it)")
        size = file.stat().st_size
        if size != expected["size"]:
            raise DamagedCheckpointError(
                f"{file} has {size} bytes, {expected['size']} were written (truncated or "
                "overwritten)"
            )
        if checksum(file)[ALGORITHM] != expected[ALGORITHM]:
            raise DamagedCheckpointError(f"{file}: its {ALGORITHM} is not the one written")


def _verify_structure(path: Path) -> None:
    """The evidence a checkpoint without a manifest offers about itself."""
    try:
        metadata = read_metadata(path)
    except FileNotFoundError:
        raise DamagedCheckpointError(f"{path / '.metadata'} is missing") from None
    except (OSError, UnsafeCheckpointError):  # may pass (retried); refused, naming the file
        raise
    except Exception as error:
        raise DamagedCheckpointError(f"{path / '.metadata'} cannot be read ({error})") from None
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise DamagedCheckpointError(f"{file} is missing (the metadata places data in it)")
        if file.stat().st_size < end:
            raise DamagedCheckpointError(
                f"{file} has {file.stat().st_size} bytes, the metadata places data up to byte "
                f"{end} (truncated)"
            )
    try:
        trainer_state = json.loads((path / TRAINER_FILE).read_text())
    except FileNotFoundError:
        raise DamagedCheckpointError(f"{path / TRAINER_FILE} is missing") from None
    except ValueError as error:
        raise DamagedCheckpointError(f"{path / TRAINER_FILE} cannot be read ({error})") from None
    # every trainer that wrote checkpoints recorded the step: without it nothing can resume
    if not isinstance(trainer_state, dict) or not isinstance(trainer_state.get("step"), int):
        raise DamagedCheckpointError(f"{path / TRAINER_FILE} records no step")
    if not list(path.glob(RANK_FILES)):
        raise DamagedCheckpointError(f"{path} has no rank files")
