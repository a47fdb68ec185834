"""Checkpoints that resume bit-exactly and survive a crash in the middle of being written.

Everything is first written to ``step_000120.tmp``; after every rank has finished, rank 0
renames it ``step_000120``. A directory without the suffix is therefore complete, and a crash
during a save leaves the previous checkpoint as the newest loadable one. Loading runs no code
from the files: a checkpoint is data. One that was published but whose bytes turn out damaged
(its recorded checksums say so) is set aside as ``step_000120.corrupt`` and the run resumes from
the one before; one whose bytes are intact but do not fit the run stops the run and changes
nothing. Nothing in a checkpoint depends on the world size that wrote it. The data pipeline's
part is handed over as bytes: every rank's saved data state, for ``data.restore_loader`` to
interpret.

- ``layout``: names of the directories and files, and which checkpoints of a run are published.
- ``writer``: writing, synchronously or in the background, and publishing atomically.
- ``integrity``: each file's size and checksum, recorded at save and checked at load.
- ``optimizer_state``: the optimizer's state by parameter name, its settings from the config.
- ``unpickling``: reading with every pickle checked against an allow-list.
- ``rank_files``: each rank's data state and RNG.
- ``load``: resuming: every rank agrees, damage falls back, incompatibility stops.
- ``rng``: every RNG's state in the form the rank files can hold.
- ``saving``: the trainer's checkpoint component: the cadence, the save at a stop, the resume.
- ``runs``: a finished run read back, its config and trained model, for eval and export.
"""

from training.checkpoint.layout import (
    CONFIG_FILE,
    checkpoint_root,
    complete_checkpoints,
    single_process_is_intended,
    step_dir_name,
    step_of,
)
from training.checkpoint.load import Loaded, Resumed, is_damage, load, load_latest, set_aside
from training.checkpoint.runs import (
    checkpoint_config,
    checkpoint_path,
    load_trained_model,
    run_config,
)
from training.checkpoint.saving import Checkpointing
from training.checkpoint.unpickling import dcp_load
from training.checkpoint.writer import CheckpointWriter, remove_crashed_saves
from training.errors import (
    CheckpointWriteError,
    DamagedCheckpointError,
    IncompatibleCheckpointError,
    NoLoadableCheckpointError,
    OtherRankFailedError,
    UnsafeCheckpointError,
)

__all__ = [
    "CONFIG_FILE",
    "CheckpointWriteError",
    "CheckpointWriter",
    "Checkpointing",
    "DamagedCheckpointError",
    "IncompatibleCheckpointError",
    "Loaded",
    "NoLoadableCheckpointError",
    "OtherRankFailedError",
    "Resumed",
    "UnsafeCheckpointError",
    "checkpoint_config",
    "checkpoint_path",
    "checkpoint_root",
    "complete_checkpoints",
    "dcp_load",
    "is_damage",
    "load",
    "load_latest",
    "load_trained_model",
    "remove_crashed_saves",
    "run_config",
    "set_aside",
    "single_process_is_intended",
    "step_dir_name",
    "step_of",
]
