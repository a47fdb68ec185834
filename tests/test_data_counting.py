"""Counting: validation_documents counts documents, each bad record is counted once over all
streams, and the loader's state gives the pipeline's counters back."""

import gzip
import itertools
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from data import IGNORE_INDEX, DataConfig, TokenizerConfig, build_loader, counters
from data import build_validation_loader as validation
from data.loader import COUNTERS
from data.text import TextStream
from scripts.pretokenize import pretokenize

EOS = 257  # the byte tokenizer's


def text(i: int) -> str:
    return f"Document {i} says the activation is applied elementwise to every unit."


def line(i: int) -> bytes:
    return json.dumps({"text": text(i)}).encode() + b"\n"


def byte_config(paths, **overrides) -> DataConfig:
    base = dict(
        source="local",
        paths=[str(p) for p in paths],
        seq_len=16,
        shuffle=False,
        num_workers=0,
        tokenizer=TokenizerConfig("bytes"),
    )
    return DataConfig(**{**base, **overrides})


def tokens_of(documents) -> list[int]:
    return [t for i in documents for t in [*text(i).encode(), EOS]]


def read_tokens(windows) -> list[int]:
    """The token stream that windows overlapping by one token cover."""
    windows = list(windows)
    targets = torch.cat([w["targets"] for w in windows])
    return [int(windows[0]["inputs"][0]), *targets[targets != IGNORE_INDEX].tolist()]


def test_validation_documents_counts_documents_not_skipped_records(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"not json\n" + b"".join(line(i) for i in range(10)))
    cfg = byte_config([path], validation_documents=3)
    assert read_tokens(validation(cfg, batch_size=None)) == tokens_of(range(3))
    assert read_tokens(TextStream(cfg, epochs=1)) == tokens_of(range(3, 10))
    # the tokenized source, which counts EOS, holds out the same three documents
    pretokenize(cfg, tmp_path / "shards", shard_tokens=10**6, workers=1)
    shards = [tmp_path / "shards" / "*.bin"]
    tokenized = byte_config(shards, source="tokenized", validation_documents=3)
    assert read_tokens(validation(tokenized, batch_size=None)) == tokens_of(range(3))
    windows = (len(tokens_of(range(3, 10))) - 1) // 16
    shards = list(itertools.islice(build_loader(tokenized, batch_size=None), windows))
    texts = list(itertools.islice(TextStream(cfg, epochs=1), windows))
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(shards, texts, strict=True))


def test_streamed_source_holds_out_documents_too(tmp_path):
    texts = [None, "", *[text(i) for i in range(10)]]
    pq.write_table(pa.table({"text": texts}), tmp_path / "docs.parquet")
    local = byte_config([tmp_path / "docs.parquet"], validation_documents=3)
    hub = byte_config([tmp_path / "docs.parquet"], source="fineweb_edu", validation_documents=3)
    assert read_tokens(validation(hub, batch_size=None)) == tokens_of(range(3))
    first = next(iter(build_loader(hub, batch_size=None)))["inputs"].tolist()
    assert first == tokens_of([3])[:16] == next(iter(TextStream(local)))["inputs"].tolist()


@pytest.fixture
def messy(tmp_path):
    """12 documents, bad records inside and outside the first three documents, a gzip file
    that stops early and a parquet file with no readable footer."""
    (tmp_path / "a.jsonl").write_bytes(
        line(0)
        + b"not json\n"
        + line(1)
        + line(2)
        + line(3)
        + b'{"text": 42}\n'
        + line(4)
        + b"\n"
        + line(5)
        + line(6)
    )
    with gzip.open(tmp_path / "b.jsonl.gz", "wb") as f:
        f.write(b"".join(line(i) for i in range(7, 12)))
    data = (tmp_path / "b.jsonl.gz").read_bytes()
    (tmp_path / "b.jsonl.gz").write_bytes(data[: len(data) - 12])  # loses the last document
    pq.write_table(pa.table({"text": [text(99)] * 50}), tmp_path / "c.parquet")
    (tmp_path / "c.parquet").write_bytes((tmp_path / "c.parquet").read_bytes()[:200])
    return [tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.parquet"]


@pytest.mark.parametrize("streams", [1, 2, 4])  # 2 fragments: by fragment, then by row
def test_each_bad_record_is_counted_once_over_all_streams(messy, streams):
    cfg = byte_config(messy, validation_documents=3)  # holds out "not json" with them
    total = Counter()
    for stream in range(streams):
        dataset = TextStream(cfg, stream, streams, epochs=1)
        list(dataset)
        total.update(dataset.state_dict()["pending"]["stats"])
    assert total["documents"] == 11 - 3
    assert total["bad_records"] == 1  # 42; "not json" is in the held-out part
    assert total["empty_documents"] == 1
    assert total["bad_files"] == 2  # the cut gzip file and the parquet file


def test_counters_sum_every_worker_and_survive_a_resume(messy):
    cfg = byte_config(messy[:1], validation_documents=0, num_workers=2)  # one fragment: by row
    assert counters(build_loader(cfg, batch_size=1).state_dict()) == dict.fromkeys(COUNTERS, 0)
    loader = build_loader(cfg, batch_size=1)
    it = iter(loader)
    next(it), next(it)  # one window from each worker: the second (stream 1) owns "not json"
    state = loader.state_dict()
    workers = state["_snapshot"]["_worker_snapshots"].values()
    documents = sum(w["dataset_state"]["pending"]["stats"]["documents"] for w in workers)
    found = counters(state)
    assert list(found) == list(COUNTERS)
    assert found["bad_records"] == 1 and found["documents"] == documents >= 2
    # unreadable files are counted when a run starts, not again when it resumes
    cfg = byte_config(messy[2:] + messy[:1], validation_documents=0)
    loader = build_loader(cfg, batch_size=1)
    next(iter(loader))
    resumed = build_loader(cfg, batch_size=1)
    resumed.load_state_dict(loader.state_dict())
    next(iter(resumed))
    assert counters(resumed.state_dict())["bad_files"] == 1
