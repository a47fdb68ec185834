"""Packing, sharding over ranks x workers, exact resume, validation slice, bad data."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from data import (
    DataConfig,
    DataError,
    TokenizerConfig,
    build_loader,
    build_validation_loader,
    check_sources,
    first_batch,
    restore_loader,
)
from data.packing import IGNORE_INDEX, Packer, document_index
from data.text import TextStream
from data_fixtures import write_parquet_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fineweb")
    docs = write_parquet_corpus(directory, files=3, row_group_size=20)
    return directory, docs


def config(directory, **overrides) -> DataConfig:
    base = dict(
        source="local",
        paths=[str(directory / "*.parquet")],
        seq_len=32,
        validation_documents=10,
        num_workers=0,
        tokenizer=TokenizerConfig("mistral_nemo"),
    )
    return DataConfig(**{**base, **overrides})


def test_packed_windows_overlap_by_one_and_every_token_is_a_target_once():
    packer = Packer(seq_len=4, eos_id=0)
    packer.add([5, 6, 7, 0])
    packer.add([8, 9, 10, 11, 0, 12])
    windows = []
    while (w := packer.pop()) is not None:
        windows.append(w)
    assert [w["inputs"].tolist() for w in windows] == [[5, 6, 7, 0], [8, 9, 10, 11]]
    assert [w["targets"].tolist() for w in windows] == [[6, 7, 0, 8], [9, 10, 11, 0]]
    (tail,) = packer.flush()  # evaluation: the rest, padded, with padding never a target
    assert tail["inputs"].tolist() == [0, 12, 0, 0]
    assert tail["targets"].tolist() == [12, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert list(packer.flush()) == []


def test_a_flushed_packer_starts_over_as_a_fresh_one():
    """A lone leftover token has no target, so it makes no window; after a flush the packer
    holds nothing (no stray token, no offset) and integer tokens, as a checkpoint saves them."""
    packer = Packer(seq_len=4, eos_id=0)
    packer.add([5, 6, 7, 8, 9])  # one window of 4 inputs, then 9 is left alone
    assert packer.pop() is not None
    assert list(packer.flush()) == []
    packer.add([21, 22, 23, 24, 25, 0])
    fresh = Packer(seq_len=4, eos_id=0)
    fresh.add([21, 22, 23, 24, 25, 0])
    pairs = [(packer.pop(), fresh.pop()), *zip(packer.flush(), fresh.flush(), strict=True)]
    for got, want in pairs:
        assert got["inputs"].tolist() == want["inputs"].tolist()
        assert got["targets"].tolist() == want["targets"].tolist()
    packer.add([1, 2])
    assert packer.state_dict()["buffer"].dtype == torch.int64


def test_a_fresh_packer_holds_integers_and_adds_document_ids_only_when_asked():
    """Nothing to pop or flush before the first document; integer tokens in its state from the
    first add (as a checkpoint saves them); the per-position document ids only with the mask."""
    plain, masked = Packer(seq_len=4, eos_id=0), Packer(seq_len=4, eos_id=0, document_mask=True)
    assert plain.pop() is None and list(plain.flush()) == []
    for packer in (plain, masked):
        packer.add([5, 6, 0, 8, 9, 10])
        assert packer.state_dict()["buffer"].dtype == torch.int64
    window = plain.pop()
    assert set(window) == {"inputs", "targets"}
    window = masked.pop()
    assert window["document_ids"].tolist() == document_index(window["inputs"], 0).tolist()
    assert window["document_ids"].tolist() == [0, 0, 0, 1]


def test_a_packer_restored_from_its_state_goes_on_with_the_same_windows():
    packer = Packer(seq_len=4, eos_id=0)
    packer.add([11, 12, 13, 14, 15, 16, 17])
    assert packer.pop()["inputs"].tolist() == [11, 12, 13, 14]  # 15, 16, 17 stay
    restored = Packer(seq_len=4, eos_id=0)
    restored.load_state_dict(packer.state_dict())
    for p in (packer, restored):
        p.add([18, 19, 0])
    assert restored.pop()["inputs"].tolist() == packer.pop()["inputs"].tolist() == [15, 16, 17, 18]
    (tail,) = restored.flush()  # 19 and the EOS are left: one target, 19 -> 0
    assert tail["targets"].tolist() == [0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_each_packed_document_is_counted_and_begins_with_a_bos_when_the_run_adds_one():
    from data.packing import pack_document
    from data.tokenizers import ByteTokenizer

    tokenizer, stats = ByteTokenizer(), Counter()
    packer = Packer(seq_len=8, eos_id=tokenizer.eos_id)
    assert list(pack_document(packer, tokenizer, "ab", True, stats)) == []  # 4 of 9 tokens
    (window,) = pack_document(packer, tokenizer, "cdef", False, stats)
    assert window["inputs"].tolist() == [256, 97, 98, 257, 99, 100, 101, 102]  # BOS a b EOS c..f
    assert stats == {"documents": 2, "tokens": 4 + 5}


def test_document_index_starts_a_new_document_after_each_eos():
    ids = document_index(torch.tensor([4, 5, 0, 6, 0, 0, 7]), eos_id=0)
    assert ids.tolist() == [0, 0, 0, 1, 1, 2, 3]


def streamed_tokens(cfg: DataConfig, rank: int, world: int) -> Counter:
    """Every token one stream reads in one epoch, as a multiset."""
    windows = list(TextStream(cfg, rank, world, epochs=1))
    counts = Counter([int(windows[0]["inputs"][0])])  # the only token that is no target
    for window in windows:
        targets = window["targets"]
        counts.update(targets[targets != IGNORE_INDEX].tolist())
    return counts


@pytest.mark.parametrize("row_group_size", [20, 1000])  # by fragment, and by row within them
def test_two_ranks_two_workers_read_every_token_once(tmp_path, row_group_size):
    write_parquet_corpus(tmp_path, files=3, row_group_size=row_group_size)
    cfg = config(tmp_path, shuffle=row_group_size == 20)
    single = streamed_tokens(cfg, 0, 1)
    # rank r's worker w is stream r * workers + w of world_size * workers (see the next test)
    combined = sum((streamed_tokens(cfg, stream, 4) for stream in range(4)), Counter())
    assert combined == single
    assert sum(single.values()) > 10_000


def test_dataloader_workers_are_the_rank_major_streams(corpus):
    directory, _ = corpus
    loader = build_loader(config(directory, num_workers=2), batch_size=2, rank=1, world_size=2)
    it = iter(loader)
    take(it, 4)
    workers = loader.state_dict()["_snapshot"]["_worker_snapshots"]
    streams = sorted(w["dataset_state"]["pending"]["stream"] for w in workers.values())
    assert streams == [2, 3]


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_yields_the_same_next_batches_twice_over(corpus, workers):
    directory, _ = corpus
    cfg = config(directory, num_workers=workers, document_mask=True, seq_len=256)
    reference = iter(build_loader(cfg, batch_size=3))
    take(reference, 5)
    first = build_loader(cfg, batch_size=3)
    it = iter(first)
    take(it, 5)
    state = first.state_dict()
    expected = take(reference, 40)  # an epoch is ~26 batches: the resume crosses its end
    resumed = build_loader(cfg, batch_size=3)
    resumed.load_state_dict(state)
    it = iter(resumed)
    got = take(it, 7)
    second_state = resumed.state_dict()
    again = build_loader(cfg, batch_size=3)
    again.load_state_dict(second_state)
    got += take(iter(again), 33)
    assert_same_batches(got, expected)


def test_resume_on_another_dataset_or_past_restore_loader_is_refused(corpus, tmp_path):
    """Another world size resumes through ``restore_loader`` (tests/test_data_repartition.py);
    a state loaded into a loader of another layout without it is refused, and so is another
    dataset, whatever the layout."""
    directory, _ = corpus
    cfg = config(directory)
    loader = build_loader(cfg, batch_size=2)
    take(iter(loader), 2)
    state = loader.state_dict()
    other_world = build_loader(cfg, batch_size=2, rank=0, world_size=2)
    other_world.load_state_dict(state)
    with pytest.raises(
        ValueError, match=r"read by 1 streams .* has 2; resume through data\.restore"
    ):
        next(iter(other_world))
    write_parquet_corpus(tmp_path, files=2)
    other_data = build_loader(config(tmp_path), batch_size=2)
    restore_loader(other_data, [state])
    changed = r"the files data\.paths matches changed .*: .*removed part_002\.parquet"
    with pytest.raises(DataError, match=changed):
        next(iter(other_data))
    other_both = build_loader(config(tmp_path), batch_size=2, rank=0, world_size=2)
    with pytest.raises(DataError, match=changed):
        restore_loader(other_both, [state])


@pytest.mark.parametrize("workers", [0, 1])
def test_first_batch_gives_a_source_s_refusal_as_its_own_words_from_a_worker_too(tmp_path, workers):
    """A DataLoader worker's exception reaches the trainer wrapped in the worker's traceback;
    the refusal the trainer prints is the source's message alone."""
    (tmp_path / "empty.jsonl").write_text("")
    cfg = DataConfig(
        source="local",
        paths=[str(tmp_path / "empty.jsonl")],
        seq_len=16,
        validation_documents=0,
        num_workers=workers,
        tokenizer=TokenizerConfig("bytes"),
    )
    batches, refusal = first_batch(build_loader(cfg, batch_size=2))
    assert batches is None
    assert str(refusal).startswith("no training document for this stream in a whole epoch")
    assert "Traceback" not in str(refusal)


def test_a_data_state_saved_before_files_were_recorded_still_resumes(corpus):
    """Checkpoints record the files' names and sizes (so a refusal can name a changed one);
    an older state without them resumes on its fingerprint alone."""
    directory, _ = corpus
    loader = build_loader(config(directory), batch_size=2)
    batches = iter(loader)
    take(batches, 2)
    state = loader.state_dict()
    expected = take(batches, 3)
    del state["dataset_state"]["pending"]["identity"]["files"]
    resumed = build_loader(config(directory), batch_size=2)
    resumed.load_state_dict(state)
    got = take(iter(resumed), 3)
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(got, expected, strict=True))


def test_validation_slice_is_held_out_and_independent_of_world_size(corpus):
    directory, docs = corpus
    cfg = config(directory, validation_documents=12)
    from data.tokenizers import load_tokenizer

    tok = load_tokenizer(cfg.tokenizer)
    held = [t for d in docs[:12] for t in [*tok.encode(d), tok.eos_id]]

    def evaluated(rank, world):
        out = []
        for batch in build_validation_loader(cfg, batch_size=4, rank=rank, world_size=world):
            t = batch["targets"]
            out.extend(t[t != IGNORE_INDEX].tolist())
        return out

    single = evaluated(0, 1)
    assert single == held[1:]
    split = evaluated(0, 2) + evaluated(1, 2)
    assert Counter(split) == Counter(single)  # the same windows, dealt to two ranks
    # training never sees a held-out document
    stream = TextStream(config(directory, validation_documents=12, shuffle=False), epochs=1)
    trained = [w["inputs"][:4].tolist() for w in stream]
    first_train_doc = tok.encode(docs[12])[:4]
    assert trained[0] == first_train_doc


def test_bad_records_are_skipped_and_counted(tmp_path, caplog):
    good = "A real sentence about gradients and activation functions. " * 5
    pq.write_table(
        pa.table({"text": [good, "", "   \n ", None, good], "int_score": [3, 3, 3, 3, 1]}),
        tmp_path / "a.parquet",
    )
    (tmp_path / "b.jsonl").write_bytes(
        b'{"text": "' + good.encode() + b'"}\n'
        b"not json at all\n"
        b'{"text": "caf\xe9 latin-1 bytes"}\n'
        b'{"other": "no text field"}\n'
        b'{"text": 42}\n'
        b"\n"
        b'["a", "list"]\n'
    )
    truncated = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [good] * 50}), truncated)
    truncated.write_bytes(truncated.read_bytes()[:200])
    cfg = DataConfig(
        source="local",
        paths=[str(tmp_path / "*.parquet"), str(tmp_path / "*.jsonl")],
        seq_len=16,
        validation_documents=0,
        shuffle=False,
        tokenizer=TokenizerConfig("llama3"),
    )
    stream = TextStream(cfg, epochs=1)
    windows = list(stream)
    stats = stream.state_dict()["pending"]["stats"]
    assert stats["documents"] == 3
    assert stats["empty_documents"] == 3  # "", whitespace, blank line
    assert stats["bad_records"] == 6  # None, bad json, latin-1, missing field, 42, a list
    assert stats["bad_files"] == 1 and "c.parquet" in caplog.text
    assert len(windows) > 0


@pytest.mark.parametrize("tokenizer", ["bytes", "mistral_nemo"])
def test_a_lone_surrogate_is_a_bad_record_for_every_tokenizer(tmp_path, tokenizer):
    """Valid JSON that no tokenizer can encode (scraped web text has it): skipped and counted
    where the text is read, so a rerun does not stop at the same record again."""
    good = "A real sentence about gradients and activation functions. " * 5
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": good}) + "\n"
        '{"text": "bad \\ud800 half of a pair"}\n'
        '{"text": "\\udfff"}\n' + json.dumps({"text": good}) + "\n"
    )
    cfg = DataConfig(
        source="local",
        paths=[str(tmp_path / "a.jsonl")],
        seq_len=16,
        validation_documents=0,
        shuffle=False,
        tokenizer=TokenizerConfig(tokenizer),
    )
    stream = TextStream(cfg, epochs=1)
    windows = list(stream)
    stats = stream.state_dict()["pending"]["stats"]
    assert (stats["documents"], stats["bad_records"]) == (2, 2)
    assert len(windows) > 0


def test_the_streamed_source_skips_what_the_file_sources_skip():
    from data.sources.fineweb_edu import _document

    assert _document({"text": "fine"}, "text") == "fine"
    for text in ("bad \ud800 half", "  \n", None, 42):
        assert _document({"text": text}, "text") is None


def test_missing_text_column_names_the_file(tmp_path):
    pq.write_table(pa.table({"content": ["text"]}), tmp_path / "x.parquet")
    stream = TextStream(config(tmp_path, validation_documents=0), epochs=1)
    with pytest.raises(ValueError, match=r"x\.parquet has no column 'text'"):
        next(iter(stream))


def test_int_score_filter_keeps_educational_documents(corpus):
    directory, docs = corpus
    everything = TextStream(config(directory, validation_documents=0), epochs=1)
    list(everything)
    filtered = TextStream(config(directory, validation_documents=0, min_int_score=4), epochs=1)
    list(filtered)
    kept = filtered.state_dict()["pending"]["stats"]
    assert kept["documents"] == sum(1 for i in range(len(docs)) if 2 + i % 3 >= 4)
    assert kept["filtered_documents"] + kept["documents"] == len(docs)
    assert everything.state_dict()["pending"]["stats"]["documents"] == len(docs)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"data\.source='s3' is not known"):
        check_sources(DataConfig(source="s3"))
    with pytest.raises(ValueError, match=r"data\.paths must list files"):
        check_sources(DataConfig(source="local"))
    with pytest.raises(FileNotFoundError, match="matches no"):
        next(iter(TextStream(DataConfig(source="local", paths=["/nonexistent/*.parquet"]))))
