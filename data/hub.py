"""FineWeb-Edu (or any text dataset) streamed with Hugging Face ``datasets``.

``datasets.load_dataset(..., streaming=True)`` reads the Hub's parquet files lazily; the stream
is split over ranks with ``split_dataset_by_node`` (by shard when the shard count divides
evenly, else one record in n each) and over DataLoader workers by ``datasets`` itself (by
shard: use at most as many workers as a rank has shards), and resumed from
``IterableDataset.state_dict()``, saved together with the packer's buffer. The first
``validation_documents`` records are held out with ``take``/``skip`` before the split, so they
are the same for every run.

The Hub is checked up front: with ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` set, or the Hub not
answering within seconds, the run stops with what to do instead (``data=local``), rather than
hanging in retries or falling back silently. ``data.paths`` (local files or ``hf://`` URLs)
streams those files with the same code and no Hub query. Shuffling is off on this path:
``datasets``' shuffle buffer is not part of its state, so a resume could not be exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

from data.config import DataConfig
from data.packing import Packer
from data.stream import check_same_identity, worker_split
from data.tokenizers import document_ids, load_tokenizer

HUB_TIMEOUT_S = 10.0
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


def hub_documents(config: DataConfig, validation: bool) -> Iterator[str | None]:
    ds = open_stream(config)
    ds = ds.take(config.validation_documents) if validation else ds
    for record in ds:
        text = record.get(config.text_column)
        yield text if isinstance(text, str) and text.strip() else None


class HubStream(IterableDataset):
    def __init__(self, config: DataConfig, rank: int = 0, world_size: int = 1) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size
        self._pending: dict | None = None
        self._live: dict | None = None
        self.stats = {"documents": 0, "tokens": 0, "skipped": 0}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        from datasets.distributed import split_dataset_by_node

        c = self.config
        tokenizer = load_tokenizer(c.tokenizer)
        _, n = worker_split(self.world_size, self.rank)  # n only fingerprints the layout
        identity = {
            "source": f"{c.hub_repo}/{c.hub_config}:{sorted(c.paths)}:{c.min_int_score}",
            "tokenizer": c.tokenizer.name,
            "seq_len": c.seq_len,
            "n_streams": n,
            "validation_documents": c.validation_documents,
        }
        # split by rank only: inside a DataLoader worker, datasets itself gives each worker its
        # own shards (splitting by rank x worker here as well would drop all but 1/W of them)
        ds = split_dataset_by_node(
            open_stream(c).skip(c.validation_documents),
            rank=self.rank,
            world_size=self.world_size,
        )
        packer = Packer(c.seq_len, tokenizer.eos_id, c.document_ids)
        epoch = 0
        if self._pending is not None:
            state = self._pending
            check_same_identity(state["identity"], identity)
            epoch = state["epoch"]
            ds.set_epoch(epoch)
            ds.load_state_dict(state["dataset"])
            packer.load_state_dict(state["packer"])
            self.stats = dict(state["stats"])
        while True:
            ds.set_epoch(epoch)
            for record in ds:
                text = record.get(c.text_column)
                if not isinstance(text, str) or not text.strip():
                    self.stats["skipped"] += 1
                    continue
                ids = document_ids(tokenizer, text, c.tokenizer.add_bos)
                self.stats["documents"] += 1
                self.stats["tokens"] += len(ids)
                packer.add(ids)
                self._live = {
                    "identity": identity,
                    "epoch": epoch,
                    "dataset": ds.state_dict(),
                    "packer": packer,
                    "stats": self.stats,
                }
                while (window := packer.pop()) is not None:
                    yield window
            if self.stats["documents"] == 0:
                raise RuntimeError("the streamed dataset yielded no training document")
            epoch += 1

    def state_dict(self) -> dict:
        if self._live is None:
            return {"pending": self._pending}
        live = dict(self._live)
        live["packer"] = live["packer"].state_dict()
        live["stats"] = dict(live["stats"])
        return {"pending": live}

    def load_state_dict(self, state: dict) -> None:
        self._pending, self._live = state["pending"], None
