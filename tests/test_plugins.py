"""Components named in XIELU_PLUGINS (training/plugins.py): found by module or file, in order;
a name that does not lead to a ``components(config)`` function is refused naming it."""

from __future__ import annotations

import pytest

from training.components import Component
from training.config import ExperimentConfig
from training.errors import ConfigError
from training.plugins import ENVIRONMENT_VARIABLE, plugin_components

PLUGIN = """
from training.components import Component

class Probe(Component):
    def __init__(self, name, every):
        self.name, self.every = name, every

def components(config):
    return [Probe("probe_" + str(config.trainer.steps), 2)]
"""


def test_a_file_and_a_module_each_add_their_components_in_order(tmp_path, monkeypatch):
    (tmp_path / "probe_plugin.py").write_text(PLUGIN)
    (tmp_path / "probe_module.py").write_text(PLUGIN.replace('"probe_"', '"module_"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, f"{tmp_path / 'probe_plugin.py'}, probe_module")
    found = plugin_components(ExperimentConfig())
    assert [c.name for c in found] == ["probe_100", "module_100"]
    assert all(isinstance(c, Component) for c in found)


def test_no_variable_no_components(monkeypatch):
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    assert plugin_components(ExperimentConfig()) == []


@pytest.mark.parametrize(
    "entry, message",
    [
        ("/no/such/plugin.py", r"XIELU_PLUGINS: no file /no/such/plugin\.py"),
        ("no_such_module_at_all", r"XIELU_PLUGINS: cannot import no_such_module_at_all"),
        ("json", r"XIELU_PLUGINS: json defines no components\(config\) function"),
    ],
)
def test_a_name_that_leads_nowhere_is_refused_naming_it(entry, message, monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, entry)
    with pytest.raises(ConfigError, match=message):
        plugin_components(ExperimentConfig())


@pytest.mark.parametrize(
    "source, message",
    [
        ("def components(config:\n", r"broken\.py cannot be loaded: SyntaxError"),
        ("import no_such_module_either\n", r"broken\.py cannot be loaded: ModuleNotFoundError"),
        ("def components(config):\n    return None\n", r"must return a list of .*got None"),
        ("def components(config):\n    return [object()]\n", r"must return a list of .*object"),
        # a components() that raises, and one that is not a function: tracebacks before
        (
            "def components(config):\n    raise RuntimeError('no GPU here')\n",
            r"broken\.py's components\(config\) raised RuntimeError: no GPU here",
        ),
        ("components = 3\n", r"broken\.py's components is not a function: 3"),
    ],
)
def test_a_plugin_that_breaks_is_refused_naming_it_and_what_it_must_do(
    source, message, tmp_path, monkeypatch
):
    (tmp_path / "broken.py").write_text(source)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(tmp_path / "broken.py"))
    with pytest.raises(ConfigError, match=rf"^XIELU_PLUGINS: .*{message}"):
        plugin_components(ExperimentConfig())


def test_a_module_whose_own_import_fails_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "half_written.py").write_text("import no_such_module_either\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "half_written")
    message = r"XIELU_PLUGINS: half_written cannot be loaded: ModuleNotFoundError.*either"
    with pytest.raises(ConfigError, match=message):
        plugin_components(ExperimentConfig())


def test_a_plugin_component_named_like_a_shipped_one_is_refused_naming_both(
    corpus, tmp_path, monkeypatch
):
    """A plugin's ``health`` beside the trainer's own: "component names repeat" named neither
    whose they were."""
    from train_helpers import compose, tiny_overrides
    from training.loop import Trainer

    (tmp_path / "clash.py").write_text(
        PLUGIN.replace('"probe_" + str(config.trainer.steps)', '"health"')
    )
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(tmp_path / "clash.py"))
    config, config_yaml = compose(tiny_overrides(corpus, tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"'health' .*StepHealth.* and .*clash.*Probe"):
        Trainer(config, config_yaml, components=plugin_components(config))
    assert not (tmp_path / "run").exists()
