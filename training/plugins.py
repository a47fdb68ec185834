"""Components added to a run from outside the code: modules named by ``XIELU_PLUGINS``.

``XIELU_PLUGINS=my_lab.probes,/path/to/faults.py python train.py ...``: each entry, a module
name or a ``.py`` file, defines ``components(config) -> list[Component]``; the trainer runs
them after its own, at the same hook points (``training.components``). A measurement for one
study then needs no edit of ``train.py``, and the test suite injects its faults (NaN losses, a
crash inside a save, a signal at a step) into ``train.py`` subprocesses the same way
(``tests/faults.py``), so no fault injection lives in the trainer's config or loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from training.components import Component
from training.config import ExperimentConfig
from training.errors import ConfigError

ENVIRONMENT_VARIABLE = "XIELU_PLUGINS"


def _module(entry: str) -> ModuleType:
    """The plugin's module, loaded; ConfigError naming the entry when it cannot be: no such
    file or module, or its own code fails (a syntax error, an import inside it)."""
    try:
        if entry.endswith(".py"):
            path = Path(entry)
            spec = importlib.util.spec_from_file_location(f"xielu_plugin_{path.stem}", path)
            if spec is None or not path.is_file():
                raise ConfigError(f"{ENVIRONMENT_VARIABLE}: no file {entry}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(entry)
    except ConfigError:
        raise
    except ImportError as error:
        if error.name == entry:  # the module itself, not one it imports
            raise ConfigError(f"{ENVIRONMENT_VARIABLE}: cannot import {entry} ({error})") from None
        raise _broken(entry, error) from error
    except Exception as error:  # a plugin is anyone's code: whatever it raises, say whose
        raise _broken(entry, error) from error


def _broken(entry: str, error: BaseException) -> ConfigError:
    return ConfigError(
        f"{ENVIRONMENT_VARIABLE}: {entry} cannot be loaded: {type(error).__name__}: {error}"
    )


def plugin_components(config: ExperimentConfig) -> list[Component]:
    """The components of every plugin the environment names, in its order."""
    found: list[Component] = []
    for entry in filter(None, os.environ.get(ENVIRONMENT_VARIABLE, "").split(",")):
        module = _module(entry.strip())
        make = getattr(module, "components", None)
        if make is None:
            raise ConfigError(
                f"{ENVIRONMENT_VARIABLE}: {entry} defines no components(config) function"
            )
        if not callable(make):
            raise ConfigError(
                f"{ENVIRONMENT_VARIABLE}: {entry}'s components is not a function: {make!r}"
            )
        try:
            made = make(config)
        except Exception as error:  # anyone's code: say whose, before anything is written
            raise ConfigError(
                f"{ENVIRONMENT_VARIABLE}: {entry}'s components(config) raised "
                f"{type(error).__name__}: {error}"
            ) from error
        if not isinstance(made, (list, tuple)) or not all(
            isinstance(component, Component) for component in made
        ):
            raise ConfigError(
                f"{ENVIRONMENT_VARIABLE}: {entry}'s components(config) must return a list of "
                f"training.components.Component, got {made!r}"
            )
        found += made
    return found
