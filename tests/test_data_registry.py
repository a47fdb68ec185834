"""The data-source registry: names, errors, and what adding a source takes."""

import inspect
import json
import pkgutil
import sys

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
    get_source,
    registry,
)
from data.registry import DataSource, register
from scripts.pretokenize import pretokenize


def test_every_module_in_data_sources_registers_the_source_it_is_named_after():
    modules = {m.name for m in pkgutil.iter_modules(data.sources.__path__)}
    assert set(available_sources()) == modules
    assert modules == {"builtin", "local", "fineweb_edu", "tokenized", "mixture"}


def test_an_unknown_source_is_refused_with_the_registered_names():
    expected = (
        r"data\.source='s3' is not known; choose one of: builtin, fineweb_edu, local, mixture, tok"
    )
    with pytest.raises(ValueError, match=expected):
        get_source("s3")
    with pytest.raises(ValueError, match=expected):
        DataConfig(source="s3")


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match="'local' is registered twice"):
        register(DataSource("local", "again", get_source("local").training, lambda c: iter(())))


def test_pretokenize_names_the_sources_it_can_read(tmp_path):
    config = DataConfig(source="tokenized", paths=[str(tmp_path / "*.bin")])
    with pytest.raises(ValueError, match=r"choose one of: builtin, fineweb_edu, local$"):
        pretokenize(config, tmp_path, shard_tokens=100, workers=1)


def test_ignore_index_is_the_losses():
    from model.loss import linear_cross_entropy

    skipped = inspect.signature(linear_cross_entropy).parameters["ignore_index"].default
    assert IGNORE_INDEX == skipped == torch.nn.CrossEntropyLoss().ignore_index


TOY_SOURCE = '''
"""toy: a source added by one module (and, for Hydra, one preset)."""

from pathlib import Path

from data.registry import register
from data.text import TextSource, text_file_source


def open_toy(config):
    return TextSource([str(Path(__file__).with_name("toy.jsonl"))])


register(text_file_source("toy", "a test corpus", open_toy))
'''


@pytest.fixture
def toy_source(tmp_path, monkeypatch):
    """A module ``toy.py`` dropped next to the real sources, and nothing else."""
    (tmp_path / "toy.py").write_text(TOY_SOURCE)
    docs = [f"Toy document {i}: the activation is applied elementwise." for i in range(20)]
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    monkeypatch.setattr(data.sources, "__path__", [*data.sources.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_discovered", False)
    yield docs
    sys.modules.pop("data.sources.toy", None)


def test_adding_a_source_is_one_module(toy_source, tmp_path):
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
