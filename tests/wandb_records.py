"""Read the history keys of an offline wandb run (``run-*.wandb``) without the network.

The file is a LevelDB-style log (a 7-byte ``:W&B`` header, 32 KiB blocks, records of a 7-byte
header ``crc32, length, type`` with types full/first/middle/last) of protobuf ``Record``s.
"""

from __future__ import annotations

import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # block trailer too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def parsed(path: Path):
    """Each record of the run file as wandb's protobuf ``Record``, with its type's name."""
    from wandb.proto import wandb_internal_pb2

    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record.WhichOneof("record_type"), record


def history_keys(path: Path) -> set[str]:
    keys = set()
    for kind, record in parsed(path):
        if kind == "history":
            keys.update(item.key or "/".join(item.nested_key) for item in record.history.item)
    return keys


def run_settings(path: Path) -> tuple[str, dict]:
    """The run's display name and its config (top-level keys, values decoded from JSON), as
    the run record and later config records set them."""
    import json

    name, config = "", {}
    for kind, record in parsed(path):
        if kind == "run":
            name = record.run.display_name or name
            items = record.run.config.update
        elif kind == "config":
            items = record.config.update
        else:
            continue
        for item in items:
            config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return name, config
