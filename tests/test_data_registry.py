"""The table of data sources: names, errors, and what adding a source takes."""

import importlib
import inspect
import json
import pkgutil

import pytest
import torch

import data.sources
from data import (
    IGNORE_INDEX,
    DataConfig,
    TokenizerConfig,
    available_sources,
    build_loader,
    build_validation_loader,
    check_sources,
    get_source,
)
from data.text import TextSource, text_file_source
from scripts.pretokenize import pretokenize


def test_the_table_holds_every_module_of_data_sources_under_its_own_name():
    modules = {m.name for m in pkgutil.iter_modules(data.sources.__path__)}
    assert modules == {"builtin", "local", "fineweb_edu", "tokenized"}
    assert available_sources() == sorted([*modules, "mixture"])
    for name in modules:
        assert importlib.import_module(f"data.sources.{name}").SOURCE is get_source(name)


def test_an_unknown_source_is_refused_with_the_names_in_the_table():
    expected = (
        r"data\.source='s3' is not known; choose one of: builtin, fineweb_edu, local, mixture, tok"
    )
    with pytest.raises(ValueError, match=expected):
        get_source("s3")
    with pytest.raises(ValueError, match=expected):
        check_sources(DataConfig(source="s3"))
    with pytest.raises(ValueError, match=r"data\.sources\[0\] \(a\): data\.source='s3' is not"):
        check_sources(DataConfig(source="mixture", sources=[{"name": "a", "source": "s3"}]))


def test_pretokenize_names_the_sources_it_can_read(tmp_path):
    config = DataConfig(source="tokenized", paths=[str(tmp_path / "*.bin")])
    with pytest.raises(ValueError, match=r"choose one of: builtin, fineweb_edu, local$"):
        pretokenize(config, tmp_path, shard_tokens=100, workers=1)


def test_ignore_index_is_the_losses():
    from model.loss import linear_cross_entropy

    skipped = inspect.signature(linear_cross_entropy).parameters["ignore_index"].default
    assert IGNORE_INDEX == skipped == torch.nn.CrossEntropyLoss().ignore_index


@pytest.fixture
def toy_source(tmp_path, monkeypatch):
    """A source added as docs/extending.md says: its ``SOURCE``, and its line in the table."""
    docs = [f"Toy document {i}: the activation is applied elementwise." for i in range(20)]
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    path = str(tmp_path / "toy.jsonl")
    toy = text_file_source("toy", "a test corpus", lambda config: TextSource([path]))
    monkeypatch.setitem(data.sources.SOURCES, "toy", toy)
    return docs


def test_adding_a_source_is_one_entry_in_the_table(toy_source, tmp_path):
    assert "toy" in available_sources()
    config = DataConfig(
        source="toy",
        seq_len=16,
        validation_documents=2,
        num_workers=0,
        tokenizer=TokenizerConfig("bytes"),
    )
    batch = next(iter(build_loader(config, batch_size=2)))
    assert batch["inputs"].shape == (2, 16)
    held = torch.cat([b["targets"] for b in build_validation_loader(config, batch_size=None)])
    expected = [t for d in toy_source[:2] for t in [*d.encode(), 257]][1:]
    assert held[held != IGNORE_INDEX].tolist() == expected
    totals = pretokenize(config, tmp_path / "shards", shard_tokens=10**6, workers=1)
    assert totals["documents"] == 20
