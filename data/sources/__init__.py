"""The data sources, by the name ``data.source`` takes: one table, as torchtitan's ``DATASETS``.

Each source is a module here that defines its ``SOURCE`` (a ``data.source.DataSource``); the
mixture (``data.mixture``) draws from the others by name. Adding a source is one module, one line
in ``SOURCES`` and one Hydra preset ``configs/data/<name>.yaml`` (docs/extending.md). The checks
that need to know a source by name live here too, reached from ``training.config.to_experiment``
(when the config is composed) and ``training.checks`` (its files, before a run starts).
"""

from __future__ import annotations

from data.config import MIXTURE, DataConfig
from data.mixture import source as mixture_of
from data.source import DataSource
from data.sources import builtin, fineweb_edu, local, tokenized

_ONE_SOURCE = {
    s.name: s for s in (builtin.SOURCE, fineweb_edu.SOURCE, local.SOURCE, tokenized.SOURCE)
}
SOURCES: dict[str, DataSource] = {**_ONE_SOURCE, MIXTURE: mixture_of(_ONE_SOURCE)}


def available_sources() -> list[str]:
    return sorted(SOURCES)


def get_source(name: str) -> DataSource:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(
            f"data.source={name!r} is not known; choose one of: {', '.join(available_sources())}"
        ) from None


def check_sources(config: DataConfig) -> None:
    """Every source the config names is known and has the ``data.paths`` it needs (a mixture's
    entries too, by the same rule, and none is given paths it would ignore). Raises ValueError
    naming the key."""
    if get_source(config.source).needs_paths and not config.paths:
        raise ValueError(f"data.paths must list files (globs) for data.source={config.source}")
    for i, (entry, (name, part)) in enumerate(
        zip(config.sources, config.mixture_parts(), strict=True)
    ):
        where = f"data.sources[{i}] ({name})"
        try:
            check_sources(part)  # a part holds no mixture: its own name and paths
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        read = SOURCES[entry.source]
        if entry.paths is not None and not (read.needs_paths or read.reads_paths):
            raise ValueError(
                f"{where}: paths: source {entry.source} reads no data.paths (it was ignored)"
            )


def check_inputs(config: DataConfig) -> None:
    """The files the config names exist and can be read as configured (each source's own
    ``check_inputs``; a mixture's names the entry), and a single source that reads no files is
    named none (``data.paths`` without ``data=local`` trained on the builtin corpus). Raises
    ValueError naming the key.

    That last rule is a mixture entry's (``check_sources``) for the run that starts; configs
    composed only to be inspected (sweeps' run directories, their price, the docs' counts) pass
    placeholder paths for every experiment, since local sources need some."""
    source = get_source(config.source)
    if config.paths and not config.sources and not (source.needs_paths or source.reads_paths):
        raise ValueError(
            f"data.paths: data.source={config.source} reads no data.paths (they would be "
            "ignored); to train on those files add data=local (text) or data=tokenized "
            "(shards); else drop them (a run that recorded them resumes with "
            "trainer.allow_changes=[data.paths])"
        )
    source.check_inputs(config)
