"""A sweep's wandb workspace in one command: the panels a researcher comparing activations opens
first, each run grouped by its activation (mean and range over its seeds).

    python -m scripts.wandb_workspace --project xielu --group optimizers_seeds --dry-run
    python -m scripts.wandb_workspace --entity my-team --project xielu --group optimizers_seeds

``--group`` is a sweep's name: ``scripts.sweep`` puts each job's wandb run in that group and tags
it with its activation, optimizer, width and seed (``training.sweeps.wandb_overrides``), so the
workspace shows exactly that sweep's runs. Saving needs a wandb server and a key (``wandb
login``, or ``WANDB_API_KEY``; ``WANDB_BASE_URL`` for a server of your own) and prints the
workspace's URL; ``--dry-run`` builds it without the network and prints its sections and keys.

Every panel reads keys the trainer logs (``training/instruments``); ``tests/test_end_to_end.py``
checks each against what a run of the end-to-end tier writes, so a renamed metric fails there
rather than leaving an empty panel. A per-layer panel names its keys by a pattern
(``^alpha_p/layer_\\d+$``, anchored, as wandb searches with it): one line per layer, however
deep the model.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    """A line plot against the step: ``keys`` as written, or every key matching ``pattern``."""

    title: str
    keys: tuple[str, ...] = ()
    pattern: str | None = None

    def shows(self, logged: set[str]) -> bool:
        """Whether a run that logged ``logged`` gives this panel a line."""
        if self.pattern is not None:
            return any(re.search(self.pattern, key) for key in logged)  # as wandb reads it
        return all(key in logged for key in self.keys)


def per_layer(prefix: str) -> str:
    return "^" + re.escape(prefix) + r"/layer_\d+$"


SECTIONS: dict[str, tuple[Panel, ...]] = {
    "Loss by activation": (
        Panel("training loss", ("loss",)),
        Panel("validation loss", ("val/loss",)),
        Panel("validation perplexity", ("val/perplexity",)),
        Panel("learning rate", ("lr",)),
    ),
    "Learned alphas by depth": (
        Panel("alpha_p, one line per layer", pattern=per_layer("alpha_p")),
        Panel("alpha_n, one line per layer", pattern=per_layer("alpha_n")),
        Panel("MLP non-linear share, per layer", pattern=per_layer("diag/nonlinear")),
        Panel("MLP pre-activation RMS, per layer", pattern=per_layer("diag/pre_rms")),
    ),
    "Gradient norms": (
        Panel("global norm before clipping", ("grad_norm",)),
        Panel("MLP, per layer", pattern=per_layer("grad_norm/mlp")),
        Panel("attention, per layer", pattern=per_layer("grad_norm/attn")),
        Panel("activation scalars, per layer", pattern=per_layer("grad_norm/act")),
        Panel("spikes and skipped steps", ("spikes", "skipped_steps")),
    ),
    "Outliers": (
        Panel("activation output kurtosis", pattern=per_layer("outliers/act_out/kurtosis")),
        Panel("activation output max / RMS", pattern=per_layer("outliers/act_out/max_over_rms")),
        Panel("pre-activation kurtosis", pattern=per_layer("outliers/pre_act/kurtosis")),
        Panel("attention output kurtosis", pattern=per_layer("outliers/attn_out/kurtosis")),
        Panel("residual stream kurtosis", pattern=per_layer("outliers/residual/kurtosis")),
    ),
    "Throughput": (
        Panel("tokens per second", ("tokens_per_s",)),
        Panel("MFU", ("mfu",)),
        Panel("step time (s)", ("step_time_s",)),
        Panel("peak memory (GiB)", ("memory_gib",)),
    ),
    "Downstream": (
        Panel("accuracy", pattern=r"^downstream/.+/acc$"),
        Panel("length-normalised accuracy", pattern=r"^downstream/.+/acc_norm$"),
    ),
}
GROUPED_BY = "model.activation"  # the config key each panel's runs are grouped by


def build_workspace(entity: str | None, project: str, group: str, name: str | None = None):
    """The workspace (``wandb_workspaces.workspaces.Workspace``); building it reads nothing."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = [
        ws.Section(
            name=title,
            is_open=True,
            panels=[
                wr.LinePlot(
                    title=p.title,
                    x="Step",
                    y=list(p.keys),
                    metric_regex=p.pattern,
                    groupby_aggfunc="mean",
                    groupby_rangefunc="minmax",
                )
                for p in panels
            ],
        )
        for title, panels in SECTIONS.items()
    ]
    return ws.Workspace(
        entity=entity or "",
        project=project,
        name=name or f"{group}: activations compared",
        sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=[ws.Metric("Group") == group], groupby=[ws.Config(GROUPED_BY)]
        ),
        settings=ws.WorkspaceSettings(x_axis="Step"),
    )


def describe(group: str) -> str:
    lines = [f"runs of wandb group {group!r}, grouped by {GROUPED_BY} (mean, min-max band)"]
    for title, panels in SECTIONS.items():
        lines.append(f"{title}:")
        for p in panels:
            what = f"/{p.pattern}/" if p.pattern is not None else ", ".join(p.keys)
            lines.append(f"  {p.title}: {what}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entity", help="the team or user (default: your wandb default)")
    parser.add_argument("--project", required=True, help="logging.wandb.project of the runs")
    parser.add_argument("--group", required=True, help="the sweep's name (its runs' group)")
    parser.add_argument("--name", help="the workspace's name (default: GROUP: activations ...)")
    parser.add_argument("--dry-run", action="store_true", help="build and print, save nothing")
    args = parser.parse_args(argv)
    entity = args.entity
    if entity is None and not args.dry_run:  # the logged-in user's default team or user
        import wandb

        entity = wandb.Api().default_entity
    workspace = build_workspace(entity, args.project, args.group, args.name)
    workspace._to_model()  # what saving would send: a panel the library refuses fails here
    print(describe(args.group))
    if not args.dry_run:
        workspace.save()
        print(workspace.url)


if __name__ == "__main__":
    main()
