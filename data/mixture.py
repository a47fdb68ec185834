"""A weighted mixture of sources (``data.source=mixture``, ``data.sources``), drawn by token.

Each source packs its own documents into its own windows, through its own resumable stream
(the source's ``training``, with the entry's settings: ``DataConfig.mixture_parts``). The
mixture then takes whole windows from the sources. Every window holds ``seq_len`` targets of one
source, so a source's share of the windows is exactly its share of the tokens: packing cannot
skew the ratios. (Mixing documents before packing would: a source of long documents fills more
of each window than its share of documents; torchtitan's attempt stopped there.)

Which source gives the next window is decided without randomness, by the rule Megatron's
blended datasets use: after ``N`` windows of which ``n_i`` came from source ``i``, the next comes
from the source with the largest deficit ``w_i (N + 1) - n_i`` (the first on a tie; weights
normalised). So at every point of every stream ``|n_i - w_i N| < 1``: the realised
proportions equal the weights to a window, not only on average. The order inside each source is
its own (shuffled from ``data.seed``), as in a run on that source alone; a mixture of one
source is that source's run, window for window.

State and resume: a stream's state is its counts ``n_i`` and each source's stream state, so a
resume on the same layout goes on exactly. On another world size or number of workers every
source re-partitions its own position by its own rule (``data.repartition``), so no token of
any source is lost or read twice; the counts of all old streams go to new stream 0 (the sum
over streams is kept, as for every counter) and the others start at zero.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Iterator, Mapping

import torch

from data.config import MIXTURE, DataConfig
from data.partition import worker_stream
from data.repartition import CannotRepartitionError, new_identity
from data.resumable import ResumableStream
from data.source import DataError, DataSource

Sources = Mapping[str, DataSource]  # the sources a mixture may draw from, by name
COUNTER_PREFIX = "mixture/"  # the training tokens each source gave: ``mixture/<name>``


def source(sources: Sources) -> DataSource:
    """``data.source=mixture``: windows of the ``sources`` that ``data.sources`` names, drawn
    by weight. The table of sources (``data/sources/__init__.py``) hands itself in, so that
    this module needs no import of it."""
    return DataSource(
        name=MIXTURE,
        summary="a weighted mixture of the sources in data.sources, drawn by token",
        training=functools.partial(MixtureStream, sources=sources),
        validation=functools.partial(validation, sources=sources),
        check=functools.partial(check, sources=sources),
        check_tokenizer=functools.partial(check_tokenizer, sources=sources),
        repartition=functools.partial(repartition, sources=sources),
    )


def source_tokens(counters: Mapping[str, int]) -> dict[str, int]:
    """Each mixed source's training tokens, by name, from the pipeline's counters
    (``data.loader.counters``, summed over ranks or not); empty for a single source."""
    return {
        k[len(COUNTER_PREFIX) :]: n for k, n in counters.items() if k.startswith(COUNTER_PREFIX)
    }


def next_source(counts: list[int], weights: list[float]) -> int:
    """The source of the next window: the largest deficit ``w_i (N + 1) - n_i``, the first on a
    tie (``weights`` sum to 1)."""
    total = sum(counts) + 1
    deficits = [w * total - n for w, n in zip(weights, counts, strict=True)]
    return max(range(len(deficits)), key=lambda i: (deficits[i], -i))


def normalised_weights(config: DataConfig) -> list[float]:
    total = sum(entry.weight for entry in config.sources)
    return [entry.weight / total for entry in config.sources]


def mixture_identity(config: DataConfig, n_streams: int) -> dict:
    """What a saved mixture state must match to resume; each source's stream checks its own."""
    return {
        "sources": [[e.name, e.source, float(e.weight)] for e in config.sources],
        "seq_len": config.seq_len,
        "n_streams": n_streams,
    }


class MixtureStream(ResumableStream):
    """Endless training windows of one stream, each window wholly from one source."""

    def __init__(
        self, config: DataConfig, rank: int = 0, world_size: int = 1, *, sources: Sources
    ) -> None:
        super().__init__(rank, world_size)
        self.config = config
        self.streams = [
            sources[part.source].training(part, rank, world_size)
            for _, part in config.mixture_parts()
        ]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        stream, n = worker_stream(self.rank, self.world_size)
        identity = mixture_identity(self.config, n)
        counts = [0] * len(self.streams)
        states: list[dict | None] = [None] * len(self.streams)
        if (state := self._resume(identity, stream)) is not None:
            counts, states = list(state["counts"]), list(state["children"])
        for source_stream, source_state in zip(self.streams, states, strict=True):
            source_stream.load_state_dict({"pending": source_state})
        self._publish(lambda: self._state(identity, stream, counts))
        weights = normalised_weights(self.config)
        windows = [iter(source_stream) for source_stream in self.streams]
        while True:
            i = next_source(counts, weights)
            try:
                window = next(windows[i])
            except DataError as error:  # e.g. a source left empty by its held-out documents
                entry = self.config.sources[i]
                raise DataError(f"data.sources[{i}] ({entry.name}): {error}") from error
            counts[i] += 1
            yield window

    def _state(self, identity: dict, stream: int, counts: list[int]) -> dict:
        children = [source_stream.state_dict()["pending"] for source_stream in self.streams]
        return state(self.config, identity, stream, list(counts), children)


def state(config: DataConfig, identity: dict, stream: int, counts: list[int], children) -> dict:
    """A mixture stream's state; its ``stats`` (read by ``data.counters``) are the sources'
    counters summed, and each source's training tokens as ``mixture/<name>``."""
    stats: Counter = Counter()
    for child in children:
        stats.update((child or {}).get("stats", {}))
    for entry, count in zip(config.sources, counts, strict=True):
        stats[COUNTER_PREFIX + entry.name] = count * config.seq_len
    return {
        "identity": identity,
        "stream": stream,
        "counts": counts,
        "children": children,
        "stats": dict(stats),
    }


def validation(config: DataConfig, *, sources: Sources) -> Iterator[dict[str, torch.Tensor]]:
    """Every source's held-out windows, one source after the other (each packed alone, as
    ``data.loader.build_validation_loaders`` measures each on its own)."""
    return itertools.chain.from_iterable(
        sources[part.source].validation(part) for _, part in config.mixture_parts()
    )


def repartition(
    config: DataConfig, old: list[dict | None], n_new: int, *, sources: Sources
) -> list[dict | None]:
    """Every source's streams re-partitioned by that source's rule; the counts summed into new
    stream 0 (see the module's docstring)."""
    identity = new_identity(old, mixture_identity(config, n_new))
    per_source = []
    for i, (name, part) in enumerate(config.mixture_parts()):
        source = sources[part.source]
        olds = [state["children"][i] if state else None for state in old]
        try:
            if source.repartition is None:
                raise CannotRepartitionError(
                    f"data.source={part.source} cannot re-partition its position; resume with "
                    "the original world size and data.num_workers"
                )
            per_source.append(source.repartition(part, olds, n_new))
        except CannotRepartitionError as error:
            raise CannotRepartitionError(f"data.sources[{i}] ({name}): {error}") from None
    total = [sum(column) for column in zip(*(s["counts"] for s in old if s), strict=True)]
    counts = total or [0] * len(config.sources)
    return [
        state(
            config,
            identity,
            t,
            counts if t == 0 else [0] * len(counts),
            [states[t] for states in per_source],
        )
        for t in range(n_new)
    ]


def check(config: DataConfig, *, sources: Sources) -> None:
    """Each source's files, as a single source's are checked, the refusal naming the entry."""
    for i, (name, part) in enumerate(config.mixture_parts()):
        try:
            sources[part.source].check_inputs(part)
        except ValueError as error:
            raise ValueError(f"data.sources[{i}] ({name}): {error}") from None


def check_tokenizer(config: DataConfig, tokenizer, *, sources: Sources) -> None:
    """Each token-shard source against the run's tokenizer, the refusal naming the entry."""
    for i, (name, part) in enumerate(config.mixture_parts()):
        if (own := sources[part.source].check_tokenizer) is not None:
            try:
                own(part, tokenizer)
            except ValueError as error:
                raise ValueError(f"data.sources[{i}] ({name}): {error}") from None
