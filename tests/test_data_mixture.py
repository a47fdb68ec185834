"""Weighted mixtures (``data.mixture``): proportions by token, exact resume on any layout.

The two sources of these tests write disjoint alphabets (long documents of ``a``-``m``, short
ones of ``n``-``z``) under the byte tokenizer, so every training token can be traced to its
source from its value alone: the measured proportions do not rely on the mixture's own counts.
"""

import itertools
import json
import random
from collections import Counter

import pytest
import torch
from test_data_repartition import assert_same_states, stream_states, take

from data import (
    DataConfig,
    DataError,
    TokenizerConfig,
    build_loader,
    check_inputs,
    check_sources,
    counters,
    get_source,
    restore_loader,
)
from data.config import MixtureSource
from data.mixture import next_source
from data.packing import IGNORE_INDEX
from data.repartition import CannotRepartitionError
from data.text import TextStream

SEQ = 16
LONG, SHORT = "abcdefghijklm", "nopqrstuvwxyz"


def write_source(directory, letters: str, documents: int, lengths: tuple[int, int], seed: int):
    rng = random.Random(seed)
    directory.mkdir()
    with (directory / "docs.jsonl").open("w") as f:
        for _ in range(documents):
            words = rng.randint(*lengths)
            text = " ".join(
                "".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(words)
            )
            f.write(json.dumps({"text": text}) + "\n")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    write_source(root / "long", LONG, 40, (40, 80), seed=1)
    write_source(root / "short", SHORT, 160, (2, 8), seed=2)
    return root


def mixture_config(root, weights=(0.3, 0.7), **overrides) -> DataConfig:
    sources = [
        {"name": name, "source": "local", "weight": weight, "paths": [f"{root}/{name}/*"]}
        for name, weight in zip(("long", "short"), weights, strict=False)  # one source or two
    ]
    base = dict(
        source="mixture",
        sources=sources,
        seq_len=SEQ,
        validation_documents=3,
        num_workers=0,
        tokenizer=TokenizerConfig("bytes"),
    )
    return DataConfig(**{**base, **overrides})


def letters_of(token: int) -> str | None:
    """The source a byte token belongs to (None: a space or EOS, in both)."""
    char = chr(token) if 0 <= token < 128 else ""
    return "long" if char and char in LONG else "short" if char and char in SHORT else None


def source_of(window_tokens: torch.Tensor) -> str:
    """The one source every letter of a window comes from."""
    found = {letters_of(t) for t in window_tokens.tolist()} - {None}
    assert len(found) == 1, f"a window mixes sources: {found}"
    return found.pop()


def windows_of(batches) -> list[dict]:
    return [
        {key: batch[key][row] for key in batch}
        for batch in batches
        for row in range(len(batch["inputs"]))
    ]


def test_the_deficit_rule_keeps_every_prefix_within_one_window_of_the_weights():
    assert next_source([0, 0, 0], [0.25, 0.5, 0.25]) == 1
    assert next_source([0, 1, 0], [0.25, 0.5, 0.25]) == 0  # a tie: the first
    rng = random.Random(0)
    for _ in range(50):
        raw = [rng.uniform(0.01, 1) for _ in range(rng.randint(2, 6))]
        weights = [w / sum(raw) for w in raw]
        counts = [0] * len(weights)
        for n in range(1, 2000):
            counts[next_source(counts, weights)] += 1
            assert all(abs(c - w * n) < 1 for c, w in zip(counts, weights, strict=True))


@pytest.mark.parametrize("weights", [(0.3, 0.7), (0.9, 0.1), (0.5, 0.5), (1.0, 4.0)])
def test_each_source_gives_its_weight_of_the_training_tokens_whatever_its_document_lengths(
    corpora, weights
):
    """Measured on the tokens themselves: packing each source alone keeps every window whole
    from one source, so long and short documents take their weight, not their count."""
    loader = build_loader(mixture_config(corpora, weights), batch_size=5)
    windows = windows_of(take(loader, 40))  # 200 windows
    tokens = Counter()
    for window in windows:
        targets = window["targets"]
        tokens[source_of(targets)] += int((targets != IGNORE_INDEX).sum())
    total = sum(tokens.values())
    assert total == 200 * SEQ
    for name, weight in zip(("long", "short"), weights, strict=True):
        share = weight / sum(weights)  # weights are relative
        assert abs(tokens[name] - share * total) < SEQ  # within one window
    counted = counters(loader.state_dict())
    assert counted["mixture/long"] == tokens["long"]
    assert counted["mixture/short"] == tokens["short"]


def test_a_mixture_of_one_source_is_that_source_window_for_window(corpora):
    mixed = mixture_config(corpora, weights=(1.0,))
    alone = DataConfig(
        source="local",
        paths=[f"{corpora}/long/*"],
        seq_len=SEQ,
        validation_documents=3,
        num_workers=0,
        tokenizer=TokenizerConfig("bytes"),
    )
    for a, b in itertools.zip_longest(
        take(build_loader(mixed, 4), 30), take(build_loader(alone, 4), 30)
    ):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    mixed_loader, alone_loader = build_loader(mixed, 4), build_loader(alone, 4)
    take(mixed_loader, 9), take(alone_loader, 9)
    mixed_counts = counters(mixed_loader.state_dict())
    assert mixed_counts.pop("mixture/long") == 9 * 4 * SEQ
    assert mixed_counts == counters(alone_loader.state_dict())  # the source's own counters
    held = list(get_source("mixture").validation(mixed))
    expected = list(get_source("local").validation(alone))
    assert len(held) == len(expected) > 0
    assert all(torch.equal(x["targets"], y["targets"]) for x, y in zip(held, expected, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_on_the_same_layout_goes_on_exactly(corpora, workers):
    config = mixture_config(corpora, num_workers=workers)
    uninterrupted = take(build_loader(config, 4), 30)
    first = build_loader(config, 4)
    take(first, 17)
    resumed = build_loader(config, 4)
    resumed.load_state_dict(first.state_dict())
    for a, b in zip(take(resumed, 13), uninterrupted[17:], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


def per_source_targets(windows) -> dict[str, Counter]:
    seen = {"long": Counter(), "short": Counter()}
    for window in windows:
        t = window["targets"]
        seen[source_of(t)].update(t[t != IGNORE_INDEX].tolist())
    return seen


@pytest.mark.slow
@pytest.mark.mutation
def test_2x2_then_1x1_then_2x1_reads_every_token_of_every_source_once_per_epoch(corpora):
    """Whatever the mixture took from a source before and after two layout changes, and what
    that source's streams read after (alone, to the end of an epoch), is that many epochs of
    the source exactly: the mixture loses and repeats nothing of any source."""
    config = mixture_config(corpora, num_workers=2)
    parts = dict(config.mixture_parts())
    epoch = {name: per_source_targets(TextStream(part, epochs=1)) for name, part in parts.items()}
    for name in parts:  # the one stream's first token, never a target
        first = next(iter(TextStream(parts[name], epochs=1)))["inputs"][0]
        epoch[name] = epoch[name][name] + Counter([int(first)])

    # phase 1: 2 ranks x 2 workers
    first = [build_loader(config, 4, rank, 2) for rank in (0, 1)]
    batches = [take(loader, 60) for loader in first]
    seen = {"long": Counter(), "short": Counter()}
    for rank_batches in batches:
        for name, counts in per_source_targets(windows_of(rank_batches)).items():
            seen[name] += counts
        for worker in (0, 1):  # each (stream, source)'s first window: its first input token
            own = windows_of(rank_batches[worker::2])
            for name in seen:
                opening = next(w for w in own if source_of(w["targets"]) == name)
                seen[name][int(opening["inputs"][0])] += 1
    saved = [loader.state_dict() for loader in first]

    # phase 2: 1 rank, in this process (no worker)
    one = mixture_config(corpora, num_workers=0)
    resumed = build_loader(one, 4)
    restore_loader(resumed, saved)
    for name, counts in per_source_targets(windows_of(take(resumed, 25))).items():
        seen[name] += counts
    (state,) = stream_states(resumed.state_dict())
    assert sum(state["counts"]) == 2 * 2 * 30 * 4 + 25 * 4  # every window taken, in new stream 0

    # phase 3: 2 ranks x 1 worker, each source's streams alone to the end of an epoch
    new = get_source("mixture").repartition(one, [state], 2)
    for i, name in enumerate(parts):
        epochs = max(new[rank]["children"][i]["epoch"] for rank in (0, 1)) + 1
        for rank in (0, 1):
            stream = TextStream(dict(one.mixture_parts())[name], rank, 2, epochs=epochs)
            stream.load_streams({rank: new[rank]["children"][i]})
            seen[name] += per_source_targets(stream)[name]
        assert seen[name] == Counter({t: epochs * n for t, n in epoch[name].items()}), name


def test_each_source_is_re_partitioned_by_its_own_rule(corpora):
    config = mixture_config(corpora, num_workers=2)
    loaders = [build_loader(config, 4, rank, 2) for rank in (0, 1)]
    for loader in loaders:
        take(loader, 12)
    old = [s for loader in loaders for s in stream_states(loader.state_dict())]
    new = get_source("mixture").repartition(config, old, 3)
    assert [state["stream"] for state in new] == [0, 1, 2]
    assert new[0]["counts"] == [sum(c) for c in zip(*(s["counts"] for s in old), strict=True)]
    assert new[1]["counts"] == new[2]["counts"] == [0, 0]
    never_ran = get_source("mixture").repartition(config, [None] * 4, 2)
    assert [state["counts"] for state in never_ran] == [[0, 0], [0, 0]]
    for i, (_, part) in enumerate(config.mixture_parts()):
        expected = get_source("local").repartition(part, [s["children"][i] for s in old], 3)
        for t in range(3):
            assert_same_states(new[t]["children"][i], expected[t])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sources": []}, r"data\.source=mixture needs data\.sources"),
        ({"source": "builtin"}, r"data\.sources lists the sources of a mixture"),
        ({"weights": (0.0, 1.0)}, r"data\.sources\[0\] \(long\): weight must be positive"),
        ({"paths": None}, r"data\.sources\[1\] \(short\): data\.paths must list files"),
        ({"names": ("a", "a")}, r"every name must be unique"),
        ({"nested": True}, r"data\.sources\[0\] \(long\): a mixture cannot hold a mixture"),
        ({"builtin": True}, r"data\.sources\[0\] \(long\): paths: source builtin reads no"),
    ],
)
def test_a_mixture_that_cannot_work_is_refused_naming_the_entry(corpora, change, message):
    config = mixture_config(corpora)
    sources = [vars(entry).copy() for entry in config.sources]
    if "weights" in change:
        sources[0]["weight"] = change["weights"][0]
    if "paths" in change:
        sources[1]["paths"] = None
    if "names" in change:
        sources[0]["name"] = sources[1]["name"] = "a"
    if "nested" in change:
        sources[0]["source"] = "mixture"
    if "builtin" in change:  # its paths were silently ignored
        sources[0]["source"] = "builtin"
    values = {
        "sources": change.get("sources", sources),
        "source": change.get("source", "mixture"),
    }
    with pytest.raises(ValueError, match=message):  # composing a config runs both
        check_sources(mixture_config(corpora, **values))


def test_a_missing_file_of_one_source_is_refused_before_a_run_naming_the_entry(corpora):
    config = mixture_config(corpora)
    config.sources[1].paths = [f"{corpora}/nowhere/*.jsonl"]
    with pytest.raises(ValueError, match=r"data\.sources\[1\] \(short\): .*nowhere"):
        check_inputs(config)


def test_the_share_report_prints_the_weights_drawn_and_the_skew_of_mixing_documents(
    corpora, capsys
):
    from scripts.study.mixture_shares import main

    sources = (
        f"data.sources=[{{name: long, source: local, weight: 0.3, paths: [{corpora}/long/*]}},"
        f" {{name: short, source: local, weight: 0.7, paths: [{corpora}/short/*]}}]"
    )
    settings = ["data.tokenizer.name=bytes", "data.seq_len=16", "data.validation_documents=3"]
    main(["--windows", "100", *settings, sources])
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| long") or line.startswith("| short")
    }
    assert rows["long"][2] == "0.3000" and rows["short"][2] == "0.7000"
    # long documents would take far more than their weight if documents were mixed
    assert float(rows["long"][5].rstrip(" |")) > 0.5


def test_every_setting_an_entry_overrides_is_a_shared_data_key():
    from dataclasses import fields

    from data.config import MIXTURE_OVERRIDES

    shared = {f.name for f in fields(DataConfig)}
    assert set(MIXTURE_OVERRIDES) <= shared and "paths" in MIXTURE_OVERRIDES


def test_a_resume_with_other_weights_or_into_another_stream_is_refused(corpora):
    first = build_loader(mixture_config(corpora), 4, rank=0, world_size=2)
    take(first, 3)
    saved = first.state_dict()
    reweighted = build_loader(mixture_config(corpora, (0.5, 0.5)), 4, rank=0, world_size=2)
    reweighted.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"its sources was \[\['long', 'local', 0\.3\]"):
        take(reweighted, 1)
    other_rank = build_loader(mixture_config(corpora), 4, rank=1, world_size=2)
    other_rank.load_state_dict(saved)
    with pytest.raises(ValueError, match="data state of stream 0 given to stream 1"):
        take(other_rank, 1)


def test_a_source_that_cannot_re_partition_is_named_with_what_to_do(corpora):
    config = mixture_config(corpora)
    config.sources.append(MixtureSource(name="hub", source="fineweb_edu", weight=0.1))
    refusal = r"data\.sources\[2\] \(hub\): data\.source=fineweb_edu cannot resume exactly"
    with pytest.raises(CannotRepartitionError, match=refusal):
        get_source("mixture").repartition(config, [None, None], 1)


def test_a_source_left_empty_by_its_held_out_documents_is_named(corpora):
    config = mixture_config(corpora)
    config.sources[0].validation_documents = 1000
    message = r"data\.sources\[0\] \(long\): .*40 documents and data\.validation_documents=1000"
    with pytest.raises(DataError, match=message):
        take(build_loader(config, 4), 2)
