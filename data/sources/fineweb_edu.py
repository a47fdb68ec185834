"""``fineweb_edu``: FineWeb-Edu (or any text dataset) streamed with Hugging Face ``datasets``.

``datasets.load_dataset(..., streaming=True)`` reads the Hub's parquet files lazily; the stream
is split over ranks with ``split_dataset_by_node`` (by shard when the shard count divides
evenly, else one record in n each) and over DataLoader workers by ``datasets`` itself (by
shard: use at most as many workers as a rank has shards), and resumed from
``IterableDataset.state_dict()``, saved together with the packer's buffer. The first
``validation_documents`` documents are held out before the split (``skip`` of the records that
hold them; records without text do not count), so they are the same for every run. Skipped
records are counted by the one rank and worker whose split holds them, never in the held-out
part.

The Hub is checked up front: with ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` set, or the Hub not
answering within seconds, the run stops with what to do instead (``data=local``), rather than
hanging in retries or falling back silently. ``data.paths`` (local files or ``hf://`` URLs)
streams those files with the same code and no Hub query. Shuffling is off on this path:
``datasets``' shuffle buffer is not part of its state, so a resume could not be exact.

A connection error in the middle of an epoch (the Hub or the network failing after
``datasets``' own per-read retries) does not end the run: the stream goes on from the
``IterableDataset.state_dict()`` after the last record it read, after an exponential backoff,
up to ``data.hub_retries`` times in a row (``resilient_records``); then it stops with what to
do. The position cannot be re-split over another number of streams: a resume on another world
size or number of workers is refused (``refuse_repartition``) with the way out (pretokenize).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np
import torch

from data.config import DataConfig
from data.documents import document_text
from data.packing import Packer, pack_document
from data.partition import worker_stream
from data.repartition import CannotRepartitionError
from data.resumable import ResumableStream
from data.source import DataError, DataSource
from data.tokenizers import encode_document, load_tokenizer
from data.validation import held_out_text_windows

log = logging.getLogger(__name__)

HUB_TIMEOUT_S = 10.0
sleep = time.sleep  # the backoff between retries; tests replace it
OFFLINE_HELP = (
    "Point the run at local copies instead: download the parquet files on a machine with "
    "internet (e.g. `huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type dataset "
    "--include 'sample/10BT/*'`) and use `data=local data.paths=[/path/to/*.parquet]`, or "
    "pretokenize them and use `data=tokenized`."
)


class HubUnreachableError(RuntimeError):
    pass


def check_hub(repo: str, timeout: float = HUB_TIMEOUT_S) -> None:
    """Fail fast, with instructions, when the Hub cannot be used."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            raise HubUnreachableError(f"{var} is set, so {repo} cannot be streamed. {OFFLINE_HELP}")
    from huggingface_hub import HfApi

    try:
        HfApi().dataset_info(repo, timeout=timeout)
    except Exception as error:
        raise HubUnreachableError(
            f"the Hugging Face Hub did not answer for {repo} within {timeout:.0f} s "
            f"({type(error).__name__}: {str(error)[:200]}). {OFFLINE_HELP}"
        ) from None


def open_stream(config: DataConfig):
    """The ``datasets`` IterableDataset of all records, in the source's order."""
    import datasets

    if config.paths:
        suffix = config.paths[0].rsplit(".", 1)[-1]
        builder = {"parquet": "parquet", "jsonl": "json", "gz": "json", "json": "json"}[suffix]
        ds = datasets.load_dataset(builder, data_files=config.paths, split="train", streaming=True)
    else:
        check_hub(config.hub_repo)
        ds = datasets.load_dataset(
            config.hub_repo, name=config.hub_config, split="train", streaming=True
        )
    if config.min_int_score is not None:
        minimum = config.min_int_score
        ds = ds.filter(lambda r: r.get("int_score") is not None and r["int_score"] >= minimum)
    return ds


def _document(record: dict, column: str) -> str | None:
    """The record's document, or None when ``data.documents`` skips it."""
    return document_text(record.get(column))[0]


def held_out_records(config: DataConfig) -> int:
    """Records that hold the first ``validation_documents`` documents (records with no text,
    or empty text, are held out with them but do not count). Read once, at a fresh start."""
    documents = config.validation_documents
    if documents == 0:
        return 0
    records = 0
    for record in open_stream(config):
        records += 1
        if _document(record, config.text_column) is not None:
            documents -= 1
            if documents == 0:
                break
    return records


def documents(config: DataConfig) -> Iterator[str | None]:
    """Every record's text in the source's order; None for a record that is skipped."""
    for record in open_stream(config):
        yield _document(record, config.text_column)


def validation_windows(config: DataConfig) -> Iterator[dict[str, torch.Tensor]]:
    """The held-out documents: the first ``validation_documents`` of the stream."""
    held = itertools.islice(filter(None, documents(config)), config.validation_documents)
    yield from held_out_text_windows(config, held)


def pretokenize_chunks(config: DataConfig, workers: int) -> Iterator[tuple[np.ndarray, Counter]]:
    """Every document, in chunks of 1000, tokenized in this process (``workers`` is unused: the
    stream is one sequence)."""
    tokenizer = load_tokenizer(config.tokenizer)
    records = documents(config)
    while batch := list(itertools.islice(records, 1000)):
        texts = [text for text in batch if text is not None]
        docs = [encode_document(tokenizer, text, config.tokenizer.add_bos) for text in texts]
        stats = Counter(documents=len(texts), skipped=len(batch) - len(texts))
        yield np.concatenate([np.zeros(0, dtype=np.int64), *docs]), stats


def is_connection_error(error: BaseException) -> bool:
    """Whether a read failed for the network's sake, so that trying again may work.

    What ``datasets`` raises once its own per-read retries are spent: ``ConnectionError``
    (``"Server Disconnected"``), ``TimeoutError`` (``asyncio``'s, fsspec's ``FSTimeoutError``),
    ``httpx`` transport errors, ``aiohttp.ClientError``, ``requests``' ``RequestException`` and
    the Hub's ``HfHubHTTPError`` (all ``OSError`` but httpx's and aiohttp's). An HTTP answer is
    retried only when it says "later" (5xx, 429); a missing or forbidden file never is.
    """
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        return status >= 500 or status == 429
    if isinstance(error, OSError):
        return True
    for module, name in (("httpx", "TransportError"), ("aiohttp", "ClientError")):
        kind = getattr(sys.modules.get(module), name, None)  # imported only if it can be raised
        if kind is not None and isinstance(error, kind):
            return True
    return False


class HubStreamError(RuntimeError):
    """Streaming failed with connection errors more times in a row than ``data.hub_retries``."""


def _failed_file(error: BaseException | None) -> str | None:
    """The URL or file an error (or one it was raised from) names, if any."""
    while error is not None:
        with contextlib.suppress(Exception):  # httpx raises when an error has no request
            return str(error.request.url)
        if getattr(error, "filename", None):
            return str(error.filename)
        error = error.__cause__ or error.__context__
    return None


def resilient_records(ds, start: dict | None, config: DataConfig, what: str):
    """``(record, ds.state_dict() after it)`` for every record of ``ds``'s current epoch.

    A connection error (:func:`is_connection_error`) restarts the iteration from the state
    after the last record yielded (``start`` before the first: the epoch's beginning when None),
    so no record is lost or repeated, after waiting ``hub_backoff_s * 2**(k - 1)`` seconds for
    the ``k``-th consecutive failure; the ``hub_retries + 1``-th raises :class:`HubStreamError`.
    A record read resets the count.
    """
    last, failures = start, 0
    while True:
        try:
            for record in ds:
                failures = 0
                last = ds.state_dict()
                yield record, last
            return
        except Exception as error:
            if not is_connection_error(error):
                raise
            failures += 1
            where = what + (f", {file}" if (file := _failed_file(error)) else "")
            if failures > config.hub_retries:
                raise HubStreamError(
                    f"streaming {where} failed {failures} times in a row, the last with "
                    f"{type(error).__name__}: {str(error)[:300]} (data.hub_retries="
                    f"{config.hub_retries}, backoff from data.hub_backoff_s="
                    f"{config.hub_backoff_s:g} s, doubling). The last checkpoint resumes "
                    "exactly once the Hub answers again; for longer outages raise "
                    f"data.hub_retries or data.hub_backoff_s. {OFFLINE_HELP}"
                ) from error
            delay = config.hub_backoff_s * 2 ** (failures - 1)
            log.warning(
                "streaming %s: %s: %s; retrying from the last record read in %.1f s (%d of %d)",
                where,
                type(error).__name__,
                str(error)[:200],
                delay,
                failures,
                config.hub_retries,
            )
            sleep(delay)
            ds.load_state_dict(last)  # None: from the epoch's beginning


def refuse_repartition(config: DataConfig, old: list[dict | None], n_new: int) -> list:
    """``DataSource.repartition``: a ``datasets`` stream's position cannot be re-split."""
    raise CannotRepartitionError(
        "data.source=fineweb_edu cannot resume exactly on another world size or number of "
        "DataLoader workers: each stream's position is the datasets IterableDataset.state_dict() "
        "of its own split of the shards, which cannot be re-split over other streams. Resume "
        "with the original world size and data.num_workers, or pretokenize the data once "
        "(`python -m scripts.pretokenize OUT_DIR --source fineweb_edu ...`) and train with "
        "`data=tokenized data.paths=[OUT_DIR/*.bin]`, which resumes on any layout."
    )


class HubStream(ResumableStream):
    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(rank, world_size)
        self.config = config

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        from datasets.distributed import split_dataset_by_node

        c = self.config
        tokenizer = load_tokenizer(c.tokenizer)
        stream, n = worker_stream(self.rank, self.world_size)  # n only fingerprints the layout
        identity = {
            "source": f"{c.hub_repo}/{c.hub_config}:{sorted(c.paths)}:{c.min_int_score}",
            "tokenizer": c.tokenizer.name,
            "seq_len": c.seq_len,
            "n_streams": n,
            "validation_documents": c.validation_documents,
        }
        state = self._resume(identity, stream)
        # saved so that a resume need not read the held-out records again
        held = state.get("held_out_records") if state else None
        if held is None:
            held = held_out_records(c)
        # split by rank only: inside a DataLoader worker, datasets itself gives each worker its
        # own shards (splitting by rank x worker here as well would drop all but 1/W of them)
        ds = split_dataset_by_node(
            open_stream(c).skip(held), rank=self.rank, world_size=self.world_size
        )
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_mask)
        stats = {"documents": 0, "tokens": 0, "skipped": 0}
        epoch, start = 0, None
        if state is not None:
            epoch, start = state["epoch"], state["dataset"]
            ds.set_epoch(epoch)
            ds.load_state_dict(start)
            packer.load_state_dict(state["packer"])
            stats = dict(state["stats"])
        live: dict = {}

        def snapshot() -> dict | None:
            if not live:  # nothing read yet: what was loaded, if anything
                return state
            return {
                "identity": identity,
                "held_out_records": held,
                **live,
                "packer": packer.state_dict(),
                "stats": dict(stats),
            }

        self._publish(snapshot)
        what = ", ".join(c.paths) if c.paths else f"{c.hub_repo} ({c.hub_config})"
        while True:
            ds.set_epoch(epoch)
            for record, position in resilient_records(ds, start, c, what):
                # the dataset's position now, while it is suspended between records
                live.update(epoch=epoch, dataset=position)
                text = _document(record, c.text_column)
                if text is None:
                    stats["skipped"] += 1
                    continue
                yield from pack_document(packer, tokenizer, text, c.tokenizer.add_bos, stats)
            if stats["documents"] == 0:
                raise DataError(
                    f"{what}: a whole epoch yielded no training document after holding out "
                    f"{c.validation_documents} (data.validation_documents; counters: {stats})"
                )
            epoch, start = epoch + 1, None


SOURCE = DataSource(
    name="fineweb_edu",
    summary="FineWeb-Edu streamed from the Hugging Face Hub (or data.paths) with datasets",
    training=HubStream,
    validation=validation_windows,
    pretokenize=pretokenize_chunks,
    repartition=refuse_repartition,
    reads_paths=True,  # local parquet / jsonl instead of the Hub
)
