"""``scripts.wandb_workspace`` builds a sweep's workspace with no network; its panels' keys are
checked against a real run in the end-to-end tier (tests/test_end_to_end.py)."""

import json

import pytest

from scripts.wandb_workspace import SECTIONS, Panel, build_workspace, main

pytest.importorskip("wandb_workspaces")


def test_the_workspace_is_built_offline_for_the_sweeps_group_grouped_by_activation():
    workspace = build_workspace("team", "xielu", "optimizers_seeds")
    view = json.loads(workspace._to_model().model_dump_json())  # what saving sends
    text = json.dumps(view)
    assert view["project"] == "xielu" and view["entity"] == "team"
    run_filter = (
        '{"key": {"section": "run", "name": "group"}, "op": "=", "value": "optimizers_seeds"'
    )
    assert run_filter in text
    # wandb keeps a nested config key's value under "value": model.activation's column
    assert '"grouping": [{"section": "config", "name": "model.value.activation"}]' in text
    sections = [s.name for s in workspace.sections]
    assert sections == list(SECTIONS)
    for section, panels in zip(workspace.sections, SECTIONS.values(), strict=True):
        assert [p.title for p in section.panels] == [p.title for p in panels]
        for built, panel in zip(section.panels, panels, strict=True):
            assert list(built.y) == list(panel.keys) and built.metric_regex == panel.pattern


def test_a_dry_run_prints_every_section_and_key_and_saves_nothing(capsys, monkeypatch):
    import wandb_workspaces.workspaces as ws

    monkeypatch.setattr(ws.Workspace, "save", lambda self: pytest.fail("a dry run saved"))
    main(["--project", "xielu", "--group", "width_ladder", "--dry-run"])
    out = capsys.readouterr().out
    assert "'width_ladder'" in out
    for title, panels in SECTIONS.items():
        assert f"{title}:" in out
        for p in panels:
            assert (p.pattern or ", ".join(p.keys)) in out


def test_a_panel_shows_a_run_only_where_the_run_logged_its_keys():
    logged = {"loss", "alpha_p/layer_00", "alpha_p/layer_11", "downstream/piqa/acc_norm"}
    assert Panel("loss", ("loss",)).shows(logged)
    assert not Panel("renamed", ("train/loss",)).shows(logged)
    assert not Panel("half", ("loss", "mfu")).shows(logged)
    alphas = next(p for p in SECTIONS["Learned alphas by depth"] if "alpha_p" in p.title)
    assert alphas.shows(logged) and not alphas.shows({"alpha_p/layer_00_mean"})
    accuracy, normalised = SECTIONS["Downstream"]
    assert normalised.shows(logged) and not accuracy.shows(logged)  # acc is not acc_norm
