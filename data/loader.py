"""DataLoaders for training (endless, resumable) and validation (finite, deterministic)."""

from __future__ import annotations

import warnings

from torch.utils.data import DataLoader, IterableDataset

from data.config import DataConfig


def training_dataset(config: DataConfig, rank: int = 0, world_size: int = 1) -> IterableDataset:
    if config.source == "tokenized":
        from data.shards import TokenStream

        return TokenStream(config, rank, world_size)
    if config.source == "fineweb_edu":
        from data.hub import HubStream

        return HubStream(config, rank, world_size)
    from data.stream import TextStream

    return TextStream(config, rank, world_size)


def build_loader(config: DataConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """A ``StatefulDataLoader``: ``state_dict()`` / ``load_state_dict()`` resume exactly.

    Each worker is its own stream (see ``data.stream``); the loader's state holds every
    worker's position and which worker's batch comes next.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    # torchdata calls a torch API that torch has deprecated; nothing for a user to act on
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

    return StatefulDataLoader(
        training_dataset(config, rank, world_size),
        batch_size=batch_size,
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
        snapshot_every_n_steps=1,
    )


def build_validation_loader(
    config: DataConfig, batch_size: int, rank: int = 0, world_size: int = 1
) -> DataLoader:
    from data.validation import ValidationStream

    return DataLoader(ValidationStream(config, rank, world_size), batch_size=batch_size)
