"""Reading a checkpoint runs no code: every pickle in it is unpickled against an allow-list.

A checkpoint directory holds three kinds of pickle, and plain ``pickle`` would run whatever a
crafted one asks for (an object whose ``__reduce__`` returns ``os.system`` is enough):

- ``rank_NNNNN.pt`` (data-pipeline state, RNG): :func:`load_weights_only`, torch's weights-only
  unpickler (tensors and plain python containers); ``training.checkpoint.rng`` stores every RNG
  state in those forms, so no extra globals are registered.
- DCP's ``.metadata``, which DCP itself reads with plain ``pickle``: :class:`MetadataUnpickler`
  admits DCP's metadata dataclasses, torch dtypes, ``torch.Size`` and paths, nothing else.
- values DCP stores as pickled bytes inside ``.distcp`` shards (the optimizer's ``lr``,
  ``betas``, ...), which its default planner unpickles with ``weights_only=False``:
  :class:`SafeLoadPlanner` reads them weights-only and accepts plain python values only.
  (The shards' tensors DCP already reads with ``weights_only=True``.)

:func:`dcp_load` is ``dcp.load`` with both. A refusal raises :class:`UnsafeCheckpointError`
naming the file and what was refused.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path, PurePath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from training.errors import UnsafeCheckpointError

PLAIN_TYPES = (int, float, bool, str, type(None), tuple, list, dict)

# What DCP's .metadata pickle references (checked on torch 2.13, for single-process and FSDP
# checkpoints): its own dataclasses and one enum, the dtypes and sizes inside them, the layout
# helper ``TensorProperties`` pickles through, and ``StorageMeta.checkpoint_id`` (a path).
DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},  # and every torch dtype, checked by value in find_class
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "pathlib._local": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
}


def load_weights_only(source: Path | io.BytesIO, where: str | Path) -> Any:
    """``torch.load(weights_only=True)`` whose refusal names the file and the refused globals.

    Other failures (a truncated or garbled file) propagate unchanged: they are damage, not an
    attack, and the caller treats them as such.
    """
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused = _unsafe_globals(source)
        if not refused:
            raise
        raise UnsafeCheckpointError(
            f"refusing to unpickle {', '.join(refused)} from {where}: a checkpoint may only "
            "contain tensors and plain python values (int, float, bool, str, None, tuple, "
            "list, dict)"
        ) from error


def _unsafe_globals(source: Path | io.BytesIO) -> list[str]:
    """The globals torch's weights-only unpickler would refuse (read statically, never run)."""
    if isinstance(source, io.BytesIO):
        source.seek(0)
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(source)
    except Exception:  # not even a readable torch.save archive: damage, reported as such
        return []


def first_non_plain(value: Any) -> str | None:
    """The type of the first value (depth first) that is not a plain python value, or None."""
    if not isinstance(value, PLAIN_TYPES):
        return f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, dict):
        children = [*value.keys(), *value.values()]
    elif isinstance(value, (tuple, list)):
        children = value
    else:
        return None
    return next((kind for child in children if (kind := first_non_plain(child))), None)


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``, constructing only what :data:`DCP_METADATA_CLASSES` lists."""

    def __init__(self, file, where: str | Path) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if name in DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"refusing to unpickle {module}.{name} from {self.where}: a checkpoint's metadata "
            "may only contain torch.distributed.checkpoint's metadata classes, torch dtypes and "
            "sizes"
        )


def read_metadata(path: Path) -> Metadata:
    """DCP's ``<checkpoint>/.metadata``, unpickled by :class:`MetadataUnpickler`."""
    file = path / ".metadata"
    with open(file, "rb") as f:
        try:
            metadata = MetadataUnpickler(f, file).load()
        except (UnsafeCheckpointError, OSError):
            raise
        except Exception as error:  # truncated or garbled: name the file, which pickle doesn't
            raise pickle.UnpicklingError(f"{file} is not readable: {error}") from error
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(
            f"refusing {file}: it holds a {type(metadata).__name__}, not DCP's Metadata"
        )
    for info in metadata.storage_data.values():
        name = PurePath(info.relative_path)
        if name.is_absolute() or ".." in name.parts:
            raise UnsafeCheckpointError(
                f"refusing {file}: it points outside its checkpoint, at {info.relative_path}"
            )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with :func:`read_metadata`; it reads only the global ``.metadata``.

    ``read_metadata`` takes no ``rank`` on purpose: DCP then does not fall back to per-rank
    ``__N.metadata`` files (our saves never write them). Its error is also kept in
    ``metadata_error``, because DCP reports a failed metadata read as "metadata is None".
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.metadata_error: Exception | None = None

    def read_metadata(self) -> Metadata:
        try:
            metadata = read_metadata(Path(self.path))
        except Exception as error:
            self.metadata_error = error
            raise
        # as DCP's reader does: tag the metadata with this load, for DCP's logging
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner whose non-tensor values are read weights-only, plain only."""

    def __init__(self, checkpoint: str | Path) -> None:
        super().__init__()
        self.checkpoint = Path(checkpoint)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        stored = self.metadata.storage_data[read_item.storage_index].relative_path
        where = f"{self.checkpoint / stored} (the value of {read_item.dest_index.fqn})"
        loaded = load_weights_only(value, where)
        if (kind := first_non_plain(loaded)) is not None:
            raise UnsafeCheckpointError(
                f"refusing to unpickle {kind} from {where}: a checkpoint's non-tensor values "
                "may only be plain python values (int, float, bool, str, None, tuple, list, "
                "dict)"
            )
        # DCP's own load_bytes places the value in the (nested) state dict; hand it bytes we
        # wrote ourselves from the checked plain value, so its unpickling has nothing to run
        checked = io.BytesIO()
        torch.save(loaded, checked)
        checked.seek(0)
        super().load_bytes(read_item, checked)


def dcp_load(state: dict, path: str | Path) -> None:
    """``dcp.load(state, checkpoint_id=path)`` through :class:`SafeFileSystemReader` and
    :class:`SafeLoadPlanner`; every rank must call it (it is a collective, like ``dcp.load``).

    DCP reports every failure as a ``CheckpointException``, which derives from BaseException
    (``except Exception`` misses it) and buries the cause in a multi-rank traceback dump. This
    re-raises the cause itself instead (a refusal first, then the lowest rank's), so callers
    see, for example, the :class:`UnsafeCheckpointError` naming the refused global or the
    error of a truncated shard, and a ``KeyboardInterrupt`` during the read stays one.
    """
    reader, planner = SafeFileSystemReader(path), SafeLoadPlanner(path)
    try:
        dcp.load(state, storage_reader=reader, planner=planner)
    except CheckpointException as failure:
        causes = [cause for _, (cause, _) in sorted(failure.failures.items())]
        if reader.metadata_error is not None:
            causes.insert(0, reader.metadata_error)
        refusals = [c for c in causes if isinstance(c, UnsafeCheckpointError)]
        cause = (refusals or causes)[0]
        cause.add_note(f"while torch.distributed.checkpoint read {path}")
        raise cause from None
