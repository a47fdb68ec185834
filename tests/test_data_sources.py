"""The tokenized-shard, builtin and streamed (datasets) sources."""

import json

import numpy as np
import pytest
import torch

from data import DataConfig, TokenizerConfig, build_loader, build_validation_loader
from data.packing import IGNORE_INDEX
from data.shards import Shard, check_tokenizer, write_shard
from data.sources.fineweb_edu import HubUnreachableError, open_stream
from data.text import TextStream
from data.tokenizers import TokenizerIdentity, identity_of, load_tokenizer
from data_fixtures import DOCUMENTS, write_parquet_corpus
from scripts.pretokenize import pretokenize


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fineweb")
    write_parquet_corpus(directory, files=3, row_group_size=20)
    return directory


def local(directory, **overrides) -> DataConfig:
    base = dict(
        source="local",
        paths=[str(directory / "*.parquet")],
        seq_len=64,
        validation_documents=10,
        shuffle=False,
        num_workers=0,
    )
    return DataConfig(**{**base, **overrides})


def made_up(vocab_size: int, eos_id: int = 3) -> TokenizerIdentity:
    """A tokenizer's identity for shards whose tokens are made up."""
    return TokenizerIdentity("test", vocab_size, None, eos_id, "0" * 16)


def windows(dataset, n=None):
    out = []
    for w in dataset:
        out.append(w)
        if n is not None and len(out) == n:
            break
    return out


def test_shard_header_round_trip_and_width(tmp_path):
    tokens = np.arange(1000) * 7 % 60000
    write_shard(tmp_path / "a.bin", tokens, made_up(60000))
    write_shard(tmp_path / "b.bin", tokens * 2, made_up(131072))
    a, b = Shard(str(tmp_path / "a.bin")), Shard(str(tmp_path / "b.bin"))
    assert a.tokens.dtype == np.uint16 and b.tokens.dtype == np.uint32
    assert np.array_equal(a.tokens, tokens) and np.array_equal(b.tokens, tokens * 2)
    assert (a.eos_id, a.vocab_size, a.identity) == (3, 60000, made_up(60000))
    with pytest.raises(ValueError, match="outside"):
        write_shard(tmp_path / "c.bin", np.array([70000]), made_up(60000))


def test_token_stream_reads_across_an_empty_shard(tmp_path):
    from data.shards import TokenCorpus

    write_shard(tmp_path / "a.bin", np.arange(10), made_up(100))
    write_shard(tmp_path / "b.bin", np.arange(0), made_up(100))
    write_shard(tmp_path / "c.bin", np.arange(10, 20), made_up(100))
    cfg = DataConfig(source="tokenized", paths=[str(tmp_path / "*.bin")], validation_documents=0)
    corpus = TokenCorpus(cfg)
    assert corpus.slice(5, 15).tolist() == list(range(5, 15))
    assert corpus.slice(0, 0).tolist() == []  # an empty validation slice


def test_truncated_or_foreign_shards_are_refused_by_name(tmp_path):
    write_shard(tmp_path / "a.bin", np.arange(100), made_up(1000))
    data = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "a.bin").write_bytes(data[:-10])
    with pytest.raises(ValueError, match=r"a\.bin is truncated"):
        Shard(str(tmp_path / "a.bin"))
    (tmp_path / "b.bin").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match=r"b\.bin is not a token shard"):
        Shard(str(tmp_path / "b.bin"))


def write_version_1_shard(path, tokens, eos_id: int, vocab_size: int) -> None:
    """A shard as written before shards recorded their tokenizer: a 64-byte header."""
    import struct

    header = struct.pack("<8sIIQqQ", b"XIELUTOK", 1, 2, len(tokens), eos_id, vocab_size)
    path.write_bytes(header.ljust(64, b"\0") + np.asarray(tokens, "<u2").tobytes())


def test_shards_are_read_only_with_the_tokenizer_that_wrote_them(parquet_dir, tmp_path):
    """Byte shards read with Tekken trained silently on garbage; Tekken shards read
    with bytes died with an IndexError at the first step."""
    byte_shards = tmp_path / "bytes"
    pretokenize(local(parquet_dir, tokenizer=TokenizerConfig("bytes")), byte_shards, 10**6, 1)
    tokenized = DataConfig(source="tokenized", paths=[str(byte_shards / "*.bin")])
    check_tokenizer(tokenized, load_tokenizer(TokenizerConfig("bytes")))  # its own: fine
    tekken = load_tokenizer(TokenizerConfig("mistral_nemo"))
    with pytest.raises(ValueError) as refused:
        check_tokenizer(tokenized, tekken)
    message = str(refused.value)
    assert "written by tokenizer 'bytes'" in message and "'mistral_nemo'" in message
    assert "vocab_size 131072 vs 258" in message and "eos_id 2 vs 257" in message
    assert "--tokenizer mistral_nemo --replace" in message
    # a vocabulary of the same size and special ids, other pieces: the fingerprint tells
    other = tmp_path / "other"
    other.mkdir()
    bytes_identity = identity_of(load_tokenizer(TokenizerConfig("bytes")))
    forged = TokenizerIdentity("bytes", 258, 256, 257, "f" * 16)
    assert bytes_identity.fingerprint != forged.fingerprint
    write_shard(other / "a.bin", np.arange(10), forged)
    forged_config = DataConfig(source="tokenized", paths=[str(other / "*.bin")])
    with pytest.raises(ValueError, match=r"fingerprint '\w+' vs 'ffff"):
        check_tokenizer(forged_config, load_tokenizer(TokenizerConfig("bytes")))


def test_version_1_shards_are_read_with_a_warning_and_what_they_recorded_is_checked(
    tmp_path, caplog
):
    old = tmp_path / "old"
    old.mkdir()
    write_version_1_shard(old / "a.bin", np.arange(300) % 256, eos_id=257, vocab_size=258)
    config = DataConfig(source="tokenized", paths=[str(old / "*.bin")], validation_documents=0)
    assert np.array_equal(Shard(str(old / "a.bin")).tokens, np.arange(300) % 256)
    with caplog.at_level("WARNING", logger="data.shards"):
        check_tokenizer(config, load_tokenizer(TokenizerConfig("bytes")))
    assert "written before shards recorded their tokenizer" in caplog.text
    with pytest.raises(ValueError, match="vocab_size 131072 vs 258"):
        check_tokenizer(config, load_tokenizer(TokenizerConfig("mistral_nemo")))


def test_pretokenize_refuses_a_used_directory_and_replaces_it_whole(parquet_dir, tmp_path):
    """3 shards, then 1 into the same directory, and the glob read 55 documents
    instead of 35."""
    config = local(parquet_dir, tokenizer=TokenizerConfig("bytes"))
    out = tmp_path / "shards"
    assert pretokenize(config, out, shard_tokens=20000, workers=1)["shards"] >= 3
    with pytest.raises(FileExistsError, match="--replace"):
        pretokenize(config, out, shard_tokens=10**9, workers=1)
    assert len(list(out.glob("*.bin"))) >= 3  # refused: untouched
    totals = pretokenize(config, out, shard_tokens=10**9, workers=1, replace=True)
    assert totals["shards"] == 1 and [p.name for p in out.iterdir()] == ["shard_00000.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]  # nothing left beside


@pytest.mark.parametrize("replace", [False, True])
def test_pretokenize_into_a_file_is_refused_naming_it_and_the_file_is_kept(
    parquet_dir, tmp_path, replace
):
    """It ended in NotADirectoryError; with --replace it would have put shards in its place."""
    config = local(parquet_dir, tokenizer=TokenizerConfig("bytes"))
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    with pytest.raises(FileExistsError, match=r"notes\.txt is a file, not a directory"):
        pretokenize(config, out, shard_tokens=10**9, workers=1, replace=replace)
    assert out.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_pretokenize_killed_halfway_leaves_the_old_shards_whole(
    parquet_dir, tmp_path, monkeypatch
):
    import scripts.pretokenize as script

    config = local(parquet_dir, tokenizer=TokenizerConfig("bytes"))
    out = tmp_path / "shards"
    pretokenize(config, out, shard_tokens=20000, workers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, written = script.write_shard, []

    def dies_after_the_first_shard(path, tokens, identity):
        if written:
            raise KeyboardInterrupt  # the kill
        written.append(path)
        real(path, tokens, identity)

    monkeypatch.setattr(script, "write_shard", dies_after_the_first_shard)
    with pytest.raises(KeyboardInterrupt):
        pretokenize(config, out, shard_tokens=20000, workers=1, replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert written[0].parent.name == "shards.partial"  # the new run wrote beside, not into
    monkeypatch.setattr(script, "write_shard", real)
    pretokenize(config, out, shard_tokens=20000, workers=1, replace=True)  # cleans it up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


@pytest.mark.parametrize("tokenizer", ["mistral_nemo", "llama3"])
def test_pretokenized_shards_yield_the_text_pipelines_windows(parquet_dir, tmp_path, tokenizer):
    text = local(parquet_dir, tokenizer=TokenizerConfig(tokenizer))
    totals = pretokenize(text, tmp_path, shard_tokens=5000, workers=1)
    assert totals["shards"] > 2 and totals["documents"] == DOCUMENTS  # several shards, one stream
    tokenized = DataConfig(
        source="tokenized",
        paths=[str(tmp_path / "*.bin")],
        seq_len=64,
        validation_documents=10,
        shuffle=False,
        num_workers=0,
    )
    from_text = windows(TextStream(text), 150)
    from_shards = windows(build_loader(tokenized, batch_size=None), 150)
    for a, b in zip(from_text, from_shards, strict=True):
        assert torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["targets"], b["targets"])
    held_text = [b["targets"] for b in build_validation_loader(text, batch_size=None)]
    held_shards = [b["targets"] for b in build_validation_loader(tokenized, batch_size=None)]
    assert torch.equal(torch.cat(held_text), torch.cat(held_shards))


@pytest.mark.slow
def test_pretokenize_in_parallel_writes_the_same_tokens(parquet_dir, tmp_path):
    cfg = local(parquet_dir, tokenizer=TokenizerConfig("llama3"))
    pretokenize(cfg, tmp_path / "serial", shard_tokens=10**9, workers=1)
    pretokenize(cfg, tmp_path / "parallel", shard_tokens=10**9, workers=2)
    serial = Shard(str(tmp_path / "serial" / "shard_00000.bin"))
    parallel = Shard(str(tmp_path / "parallel" / "shard_00000.bin"))
    assert serial.tokens.dtype == np.uint32  # 128256 entries do not fit uint16
    assert np.array_equal(serial.tokens, parallel.tokens)


def test_tokenized_resume_and_sharding(parquet_dir, tmp_path):
    pretokenize(local(parquet_dir), tmp_path, shard_tokens=4000, workers=1)
    cfg = DataConfig(
        source="tokenized",
        paths=[str(tmp_path / "*.bin")],
        seq_len=32,
        validation_documents=10,
        num_workers=0,
    )
    loader = build_loader(cfg, batch_size=4)
    it = iter(loader)
    windows(it, 3)
    state = loader.state_dict()
    expected = windows(it, 250)  # crosses an epoch: a new permutation
    resumed = build_loader(cfg, batch_size=4)
    resumed.load_state_dict(state)
    got = windows(iter(resumed), 250)
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(got, expected, strict=True))
    # four streams split one epoch's windows without overlap
    from data.sources.tokenized import TokenStream

    per_stream = [windows(TokenStream(cfg, s, 4), 40) for s in range(4)]
    starts = [tuple(w["inputs"][:8].tolist()) for ws in per_stream for w in ws]
    assert len(set(starts)) == len(starts)


@pytest.mark.slow
def test_builtin_corpus_is_deterministic_english_prose(tmp_path):
    from data.sources.builtin import build_documents, builtin_corpus_path

    docs = build_documents()
    assert sum(map(len, docs)) > 1_000_000 and len(docs) > 300
    path = builtin_corpus_path(str(tmp_path))  # a second, independent build
    assert [json.loads(line)["text"] for line in path.read_text().splitlines()] == docs
    cfg = DataConfig(seq_len=32, cache_dir=str(tmp_path), num_workers=0)
    batch = next(iter(build_loader(cfg, batch_size=2)))
    assert batch["inputs"].shape == (2, 32)


def test_hub_offline_fails_fast_with_instructions(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachableError, match=r"HF_HUB_OFFLINE is set.*data=local"):
        open_stream(DataConfig(source="fineweb_edu"))


def test_unreachable_hub_fails_after_one_bounded_probe(monkeypatch):
    """Fast failure by construction: one request with a short timeout, no retry loop, then the
    error that says what to do (a refused connection here, so nothing waits on a clock)."""
    from huggingface_hub import HfApi

    from data.sources.fineweb_edu import HUB_TIMEOUT_S

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    probes = []
    real_dataset_info = HfApi.dataset_info

    def probe(self, repo_id, **kwargs):
        probes.append(kwargs.get("timeout"))
        return real_dataset_info(self, repo_id, **kwargs)

    monkeypatch.setattr(HfApi, "dataset_info", probe)
    with pytest.raises(HubUnreachableError, match=r"did not answer.*data\.paths"):
        open_stream(DataConfig(source="fineweb_edu"))
    assert probes == [HUB_TIMEOUT_S] and HUB_TIMEOUT_S <= 15


def test_streamed_source_resumes_exactly_after_two_resumes(parquet_dir):
    # the datasets streaming path on local parquet: same code as the Hub, no network
    cfg = DataConfig(
        source="fineweb_edu",
        paths=[str(p) for p in sorted(parquet_dir.glob("*"))],
        seq_len=64,
        validation_documents=10,
        num_workers=0,
    )
    reference = iter(build_loader(cfg, batch_size=2))
    windows(reference, 4)
    expected = windows(reference, 60)  # more than an epoch (~45 batches)
    loader = build_loader(cfg, batch_size=2)
    windows(iter(loader), 4)
    first = build_loader(cfg, batch_size=2)
    first.load_state_dict(loader.state_dict())
    it = iter(first)
    got = windows(it, 10)
    second = build_loader(cfg, batch_size=2)
    second.load_state_dict(first.state_dict())
    got += windows(iter(second), 50)
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(got, expected, strict=True))
    held = [b["targets"] for b in build_validation_loader(cfg, batch_size=None)]
    local_held = [b["targets"] for b in build_validation_loader(local(parquet_dir), None)]
    assert torch.equal(torch.cat(held), torch.cat(local_held))
    assert (torch.cat(held) != IGNORE_INDEX).sum() > 100


def test_the_builtin_corpus_finds_definitions_in_ast_walks_order():
    """Its walk skips expressions: the same definitions as ``ast.walk``, in its order (the
    corpus's documents), nested in classes, functions, branches, handlers and match cases."""
    import ast
    import sysconfig
    from pathlib import Path

    from data.sources.builtin import _statements

    source = """
def a(): pass
class B:
    def c(self):
        def d(): pass
if x:
    def e(): pass
try:
    pass
except E:
    def f(): pass
else:
    class G: pass
match y:
    case 1:
        def h(): pass
async def i():
    with z:
        def j(): pass
"""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    trees = [ast.parse(source), *(ast.parse(p.read_text()) for p in stdlib.glob("a*.py"))]
    definitions = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for tree in trees:
        walked = [n for n in ast.walk(tree) if isinstance(n, definitions)]
        assert [n for n in _statements(tree) if isinstance(n, definitions)] == walked
    names = [n.name for n in _statements(trees[0]) if isinstance(n, definitions)]
    assert names == list("aBiceGdfhj")  # breadth first: by depth, then in source order


def test_the_tests_real_text_refuses_to_be_empty(monkeypatch):
    """An interpreter without pydoc topics would leave every corpus the tests write empty, and
    a test of an empty corpus passes for nothing: the fixture raises instead."""
    import data.sources.builtin
    from data_fixtures import real_documents

    monkeypatch.setattr(data.sources.builtin, "build_documents", lambda part="all": [])
    with pytest.raises(RuntimeError, match=r"gave 0 paragraphs"):
        real_documents()
