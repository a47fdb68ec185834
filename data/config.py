"""The data pipeline's configuration: every data knob, its type, default and meaning.

The source-specific settings (the Hub's retries, the text column, the score filter) sit here
too, beside the shared ones, so that Hydra checks them all in one schema; a source reads the
ones it needs. The values are checked here (:meth:`DataConfig.check`: refused when the config
is composed, and against the model's ``max_seq_len`` when a run starts); what needs a source
known by name (its ``data.paths``, its files) is checked beside the table of sources
(``data/sources/__init__.py``), which imports this module. The tokenizer's section is its
module's (``data.tokenizers.TokenizerConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from data.tokenizers import TokenizerConfig
from settings import ConfigError, Run, Section, at_least, one_of

BUILTIN_PARTS = ("all", "reference", "docstrings")
MIXTURE = "mixture"  # the source that reads ``data.sources`` (``data.mixture``)

# the smallest value of each numeric knob
MINIMUM = {
    "seq_len": 1,
    "validation_documents": 0,
    "num_workers": 0,
    "hub_retries": 0,
    "hub_backoff_s": 0,
}


@dataclass
class MixtureSource:
    """One source of a mixture (``data.sources``). Every field but ``name``, ``weight`` and
    ``source`` overrides the ``data.*`` key of the same name for this source alone; ``None``
    keeps the shared value (the tokenizer, sequence length, shuffle and workers are always
    shared: every window of a batch must be alike).

    Attributes:
        name: the source's label in the logs (``data/mixture/<name>``, ``val/loss/<name>``).
        weight: its share of the training tokens, relative to the others' weights.
        source: a registered source (not ``mixture``).
    """

    name: str = "?"
    weight: float = 1.0
    source: str = "builtin"
    paths: list[str] | None = None
    text_column: str | None = None
    min_int_score: int | None = None
    validation_documents: int | None = None
    hub_repo: str | None = None
    hub_config: str | None = None
    builtin_part: str | None = None


# the fields of a MixtureSource that override the shared DataConfig's
MIXTURE_OVERRIDES = tuple(
    f.name for f in fields(MixtureSource) if f.name not in ("name", "weight", "source")
)


@dataclass
class DataConfig(Section):
    """Attributes:
    source: a name in the table of ``data/sources/__init__.py``: ``builtin`` (offline
        smoke-test corpus), ``local`` (parquet/jsonl files), ``fineweb_edu`` (streamed from the
        Hugging Face Hub), ``tokenized`` (binary shards) or ``mixture`` (the weighted
        ``sources``, ``data.mixture``).
    sources: with ``source=mixture``, the sources mixed and their weights (``MixtureSource``;
        ``data.mixture`` says how windows are drawn); empty otherwise.
    paths: glob patterns; ``local``: ``*.parquet``, ``*.jsonl``, ``*.jsonl.gz``;
        ``tokenized``: ``*.bin`` written by ``scripts/pretokenize.py``.
    text_column: the column holding document text.
    hub_repo: the dataset repository streamed by ``fineweb_edu``.
    hub_config: its configuration (``sample-10BT``, ``sample-100BT``, ``default``, a CC-MAIN dump).
    hub_retries: ``fineweb_edu``: how many times in a row a read that fails with a connection
        error in the middle of an epoch is retried, going on exactly from the last record read
        (on top of ``datasets``' own retries of each read); then the run stops, saying so.
    hub_backoff_s: the wait before the first of those retries, doubled for each next one
        (2, 4, 8, 16, 32 s by default).
    min_int_score: keep only documents with ``int_score`` at least this (FineWeb-Edu's 0-5
        educational score); ``None`` keeps all.
    seq_len: tokens per training sequence; windows of ``seq_len + 1`` give inputs and targets.
    document_mask: also yield each position's document index within its window (the batch key
        ``document_ids``), so that attention is restricted to the position's own document.
    validation_documents: the first documents of the source, held out from training; the same
        for every run, activation and world size, so perplexities are comparable. Documents,
        not records: skipped records (bad, empty, filtered) among them do not count.
    shuffle: permute the order of source fragments (text) or windows (tokenized) each epoch,
        from ``seed``; exact on resume (no shuffle buffer whose content would be lost).
    seed: seed of that permutation.
    num_workers: DataLoader worker processes per rank.
    cache_dir: where the builtin corpus is cached (default ``~/.cache/xielu-llm``).
    builtin_part: which documents of the builtin corpus: ``all``, ``reference`` (the language
        reference's topics) or ``docstrings`` (the standard library's): two corpora of
        different style, for an offline mixture.
    """

    source: str = "builtin"
    sources: list[MixtureSource] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    text_column: str = "text"
    hub_repo: str = "HuggingFaceFW/fineweb-edu"
    hub_config: str = "sample-10BT"
    hub_retries: int = 5
    hub_backoff_s: float = 2.0
    min_int_score: int | None = None
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    seq_len: int = 256
    document_mask: bool = False
    validation_documents: int = 100
    shuffle: bool = True
    seed: int = 0
    num_workers: int = 1
    cache_dir: str | None = None
    builtin_part: str = "all"

    def __post_init__(self) -> None:
        # entries given as mappings (Python callers, ``dataclasses.replace``) become sections
        if isinstance(self.tokenizer, dict):
            self.tokenizer = TokenizerConfig(**self.tokenizer)
        self.sources = [
            MixtureSource(**entry) if isinstance(entry, dict) else entry for entry in self.sources
        ]
        super().__post_init__()

    def check(self, run: Run | None = None) -> None:
        for key, minimum in MINIMUM.items():
            at_least(f"data.{key}", getattr(self, key), minimum)
        one_of("data.builtin_part", self.builtin_part, BUILTIN_PARTS)
        if (self.source == MIXTURE) != bool(self.sources):
            raise ConfigError(
                "data.sources lists the sources of a mixture and needs data.source=mixture "
                f"(data=mixture), and data.source=mixture needs data.sources; got "
                f"data.source={self.source} with {len(self.sources)} data.sources"
            )
        self.mixture_parts()  # each source's own settings checked now, naming its entry
        if run is not None and self.seq_len > run.config.model.max_seq_len:
            raise ConfigError(
                f"data.seq_len={self.seq_len} exceeds model.max_seq_len="
                f"{run.config.model.max_seq_len}"
            )

    def mixture_parts(self) -> list[tuple[str, DataConfig]]:
        """``(name, config)`` of each source of a mixture, in order: this config with the
        entry's source and overrides, and no ``sources``; ``[]`` for a single source."""
        names = [entry.name for entry in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"data.sources: every name must be unique, got {names}")
        parts = []
        for i, entry in enumerate(self.sources):
            where = f"data.sources[{i}] ({entry.name})"
            if entry.source == MIXTURE:
                raise ConfigError(f"{where}: a mixture cannot hold a mixture")
            if not entry.weight > 0:
                raise ConfigError(f"{where}: weight must be positive, got {entry.weight}")
            given = {k: getattr(entry, k) for k in MIXTURE_OVERRIDES}
            overrides = {k: v for k, v in given.items() if v is not None}
            try:
                parts.append(
                    (entry.name, replace(self, source=entry.source, sources=[], **overrides))
                )
            except ValueError as error:
                raise ConfigError(f"{where}: {error}") from None
        return parts
