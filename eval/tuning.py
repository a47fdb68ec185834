"""A ladder's learning rates, taken from the runs of its tuning sweep at the base width.

Under µP (``model.parametrization=mup``) the rate tuned at the base width holds at every width,
so a width ladder is two sweeps: a tuning sweep at the base (each activation at several rates,
the selection seed) and the ladder (each activation at its best rate, every width, the other
seeds). The ladder's sweep file names the first:

    tuned_by: ladder_h100_tune   # optim.lr per activation: that sweep's best at the base width

and ``scripts.sweep`` fills in the rate per activation and optimizer from that sweep's finished
runs before it launches anything (:func:`with_tuned_rates`). The rate is the setting the
optimizer's rate sweeps vary (``OptimConfig.tuned_rate``): ``optim.lr``, or ``optim.muon.lr``
under Muon. Muon's AdamW part (embedding, head, norms, scalars) trains at ``optim.lr``: where
the tuning sweep varies it too, the ladder takes the best run's pair, both rates, since the
best Muon rate at one AdamW rate need not be the best at another; where it holds it fixed, the
ladder keeps the ``optim.lr`` its own grid sets. A tuning run still missing stops the ladder
with the list of what is missing and the command that runs it: a rate picked from half a grid
would be a silent guess. A diverged tuning run counts as the worst rate, not as missing.
"""

from __future__ import annotations

import copy
from pathlib import Path

from eval.runs import Run, best_runs, read_run
from training.optim import OptimConfig
from training.sweeps import ROOT, expand, load_sweep, resolve


def tuned_rates(sweep: dict, extra: list[str] = ()) -> dict[tuple[str, str], dict[str, float]]:
    """(activation, optimizer) -> {setting: rate} for a ladder sweep with ``tuned_by``: the
    optimizer's ``tuned_rate``, and ``optim.lr`` beside it where that is another setting the
    tuning runs vary (Muon's pair); SystemExit naming the tuning runs that have not finished."""
    tune_name = sweep["tuned_by"]
    ladder = [resolve(job) for job in expand(sweep, extra)]
    bases = {c.model.mup_base_dim for c in ladder}
    if any(c.model.parametrization != "mup" for c in ladder) or len(bases) != 1:
        raise SystemExit(
            f"tuned_by: {tune_name}: a ladder carries rates across widths under "
            "model.parametrization=mup with one model.mup_base_dim"
        )
    (base,) = bases
    wanted = {_arm(c) for c in ladder}
    runs, missing = [], []
    for job in expand(load_sweep(tune_name), extra):
        config = resolve(job)
        at_base = config.model.parametrization == "mup" and config.model.dim == base
        if _arm(config) not in wanted or not at_base:
            continue
        run = _finished(ROOT / config.trainer.run_dir)
        if run is None:
            missing.append(config.trainer.run_dir)
        else:
            runs.append(run)
    if missing:
        shown = "\n  ".join(missing[:8]) + ("\n  ..." if len(missing) > 8 else "")
        raise SystemExit(
            f"the ladder takes its rates from the sweep {tune_name!r} at the base width {base}, "
            f"and {len(missing)} of its runs have not finished:\n  {shown}\n"
            f"run them first: python -m scripts.sweep {tune_name} " + " ".join(extra)
        )
    best = best_runs(runs, base)
    absent = sorted(wanted - set(best))
    if absent:
        named = ", ".join(f"activation={a} under optim.name={o}" for a, o in absent)
        raise SystemExit(f"the sweep {tune_name!r} tunes no rate for {named}")
    rates = {}
    for arm, run in best.items():
        setting = OptimConfig(name=arm[1]).tuned_rate
        rates[arm] = {setting: run.rate}
        rest = {r.lr for r in runs if (r.activation, r.optimizer) == arm}
        if setting != "optim.lr" and len(rest) > 1:
            rates[arm]["optim.lr"] = run.lr
    return rates


def _arm(config) -> tuple[str, str]:
    return (config.model.activation, config.optim.name)


def _finished(run_dir: Path) -> Run | None:
    if not (run_dir / "metrics.jsonl").is_file():
        return None
    run = read_run(run_dir)
    return run if run.final is not None or run.diverged else None


def with_tuned_rates(
    sweep: dict, rates: dict[tuple[str, str], dict[str, float]], extra: list[str] = ()
) -> dict:
    """The sweep with each grid split by activation and the rates tuned for the pair
    (:func:`tuned_rates`) set; a grid that fixes its activation in ``overrides`` gets that
    activation's rates. ``extra``: the settings appended
    to every job (``data.paths``), without which a grid's config may not compose."""
    out = copy.deepcopy(sweep)
    out["grids"] = []
    for grid in sweep["grids"]:
        fixed = dict(o.split("=", 1) for o in grid["overrides"])
        activations = grid["sweep"].get("activation", [fixed.get("activation")])
        for activation in activations:
            split = copy.deepcopy(grid)
            split["sweep"] = {k: v for k, v in grid["sweep"].items() if k != "activation"}
            overrides = [o for o in grid["overrides"] if not o.startswith("activation=")]
            optim = resolve([*overrides, f"activation={activation}", *extra]).optim
            if (activation, optim.name) not in rates:
                raise SystemExit(
                    f"no tuned rate for activation={activation} under optim.name={optim.name}"
                )
            tuned = rates[(activation, optim.name)]
            split["overrides"] = [
                *(o for o in overrides if o.split("=", 1)[0] not in tuned),
                f"activation={activation}",
                *(f"{setting}={value:g}" for setting, value in tuned.items()),
            ]
            if set(tuned) & set(split["sweep"]):
                raise SystemExit(
                    f"the sweep's grid varies {', '.join(sorted(set(tuned) & set(split['sweep'])))}"
                    " that its tuned_by sweep sets: a tuned ladder takes its rates, not a grid"
                )
            out["grids"].append(split)
    return out
