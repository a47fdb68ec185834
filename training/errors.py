"""Every exception the trainer raises on purpose, in one place: what each means, and so what a
caller (``train.py``, the evaluation, a test) may do about it. Raising modules import from here;
this module imports nothing of ``training/`` (a refused setting's :class:`ConfigError` is the one
``settings`` defines for every section, ``model`` and ``data`` too), so no import runs back up.

Refusals (nothing was written, nothing changed): :class:`ConfigError`,
:class:`IncompatibleCheckpointError`, :class:`NoLoadableCheckpointError`. A run that stops:
:class:`NonFiniteTrainingError`, :class:`CheckpointWriteError`. Evidence about a checkpoint's
bytes, decided by the loader: :class:`DamagedCheckpointError`, :class:`UnsafeCheckpointError`,
:class:`CheckpointFormatError`, :class:`OtherRankFailedError`.
"""

from __future__ import annotations

import pickle
from pathlib import Path

# re-exported: every refusal the trainer raises, in one place
from settings import ConfigError as ConfigError


class NonFiniteTrainingError(RuntimeError):
    """Too many steps in a row with a non-finite loss or gradient, or non-finite weights before
    a save: the run stops rather than overwrite a good checkpoint."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous one is untouched."""


class CheckpointFormatError(RuntimeError):
    """A checkpoint without a part this trainer registers: written by another version."""


class DamagedCheckpointError(RuntimeError):
    """The checkpoint's bytes are not the ones that were written: set it aside, use an older one."""


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file holds a pickle that would construct something outside the allow-list."""


class NoLoadableCheckpointError(RuntimeError):
    """Checkpoints exist and none of them loads: never silently start over from step 0."""

    def __init__(self, run_dir: str | Path, failures: list[tuple[Path, str]], consequence: str):
        listing = "\n".join(f"  {path.name}: {reason}" for path, reason in failures)
        super().__init__(
            f"{run_dir}: none of its {len(failures)} checkpoints can be loaded; {consequence}. "
            f"Why each failed:\n{listing}"
        )


class IncompatibleCheckpointError(RuntimeError):
    """A checkpoint whose bytes are intact does not load into this run: refuse, rename nothing."""

    def __init__(self, path: Path, error: BaseException) -> None:
        self.path, self.cause = path, error
        # the state's keys in the error say which part does not fit (training.checkpoint.state)
        if "optim." in str(error):
            part = (
                "the optimizer's state differs from the run's (optim.name, or its settings, on "
                "the command line against the config.yaml in that checkpoint: its moments are "
                "another optimizer's)"
            )
        else:
            part = (
                "Most often the model differs from the run's (model.* on the command line "
                "against the config.yaml in that checkpoint)"
            )
        super().__init__(
            f"{path} is intact (its files are the ones written) but does not load into this "
            f"run: {type(error).__name__}: {error}\nNothing was changed. {part[0].upper()}"
            f"{part[1:]}: run the command that started it, or give this run another "
            "trainer.run_dir. If you know the checkpoint is bad, move it out of checkpoints/ "
            "and rerun to resume from the one before."
        )


class OtherRankFailedError(RuntimeError):
    """Raised on the ranks that loaded their part fine when another rank did not, so that every
    rank takes the same decision; ``damage`` and ``transient`` say which
    (``training.checkpoint.load``: ``is_damage``, ``is_transient``)."""

    def __init__(self, message: str, damage: bool, transient: bool = False) -> None:
        super().__init__(message)
        self.damage, self.transient = damage, transient
