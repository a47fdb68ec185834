"""A finished (or stopped) training run as the reports read it: its config and metrics.

``metrics.jsonl`` and ``config.yaml`` are what a run directory keeps for good; every report
(``scripts.study.study_report``, ``scripts.study.width_report``, ``scripts.results_table``) and
the choice of a ladder's rates (``eval.tuning``) read runs through this module, so they agree on
what the final loss, a diverged run and a run's arm are. A study's per-run table
(``<page>_runs.csv``: :func:`write_runs_csv`, written by each report beside its page) holds every
number the reports read, so a report runs on it as on the run directories, and a reader can
recompute it.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from data import load_tokenizer
from model import count_parameters
from training.checkpoint import run_config
from training.config import config_value
from training.optim import OptimConfig
from training.schedule import stable_phase_end


def read_metrics(run_dir: str | Path) -> list[dict]:
    """A run's ``metrics.jsonl`` records in step order, the later record winning for steps
    logged twice (a resumed run logs again the steps after its last checkpoint); training,
    validation and diagnostics records of one step are kept apart."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl")
    by_key: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        kind = "val" if "val/loss" in record else "train" if "loss" in record else "other"
        if kind == "other":  # diagnostics, gradient norms: by their keys' prefixes
            kind = ",".join(sorted({k.split("/")[0] for k in record if k != "step"}))
        by_key[(kind, record["step"])] = record
    return [by_key[k] for k in sorted(by_key, key=lambda k: (k[1], k[0]))]


@dataclass
class Run:
    path: Path
    activation: str
    init: str  # model.init_scaling, or "mup" under model.parametrization=mup
    width: int
    optimizer: str  # optim.name
    rate: float  # the one its optimizer's rate sweeps vary: OptimConfig.tuned_rate
    lr: float  # optim.lr: ``rate`` under AdamW, the rest's (embeddings, norms) under Muon
    seed: int
    params: int  # without the embedding and LM head: the count scaling laws use
    tokens_per_step: int
    val: dict[int, float]  # step -> validation loss
    steps: int
    stable_end: int | None
    diverged: bool = False  # a training loss that is not finite: the run stopped there
    diagnostics: dict[int, dict[str, float]] = field(default_factory=dict)
    outliers: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> telemetry

    @property
    def arm(self) -> tuple[str, str, int]:
        return (self.activation, self.init, self.width)

    @property
    def final(self) -> float | None:
        return self.val.get(self.steps)


def read_run(path: str | Path) -> Run:
    config = run_config(path)
    model = config.model.with_vocab_from_tokenizer(load_tokenizer(config.data.tokenizer).vocab_size)
    count = count_parameters(model)
    records = read_metrics(path)
    stable_end = stable_phase_end(config.schedule, config.trainer.steps)
    return Run(
        path=Path(path),
        activation=model.activation,
        init="mup" if model.parametrization == "mup" else model.init_scaling,
        width=model.dim,
        optimizer=config.optim.name,
        rate=config_value(config, config.optim.tuned_rate),
        lr=config.optim.lr,
        seed=config.trainer.seed,
        params=count.total - count.embedding - count.lm_head,
        tokens_per_step=config.sequences_per_step * config.data.seq_len,
        val={r["step"]: r["val/loss"] for r in records if "val/loss" in r},
        steps=config.trainer.steps,
        stable_end=stable_end,
        diverged=any("loss" in r and not math.isfinite(r["loss"]) for r in records),
        diagnostics={
            r["step"]: {k: v for k, v in r.items() if k.startswith("diag/")}
            for r in records
            if any(k.startswith("diag/") for k in r)
        },
        outliers={
            r["step"]: {k: v for k, v in r.items() if k.startswith("outliers/")}
            for r in records
            if any(k.startswith("outliers/") for k in r)
        },
    )


# a run as one row of a study's per-run table: every number its reports read (the final and
# the stable-phase validation loss) and the axes that say which run it is
RUN_COLUMNS = (
    "run",
    "activation",
    "init",
    "width",
    "optimizer",
    "rate",
    "lr",
    "seed",
    "params",
    "tokens_per_step",
    "steps",
    "stable_end",
    "diverged",
    "final",
    "stable",
)


def run_row(run: Run) -> dict:
    """``run`` as a row of :data:`RUN_COLUMNS` (its directory's name as ``run``)."""
    stable = run.val.get(run.stable_end) if run.stable_end is not None else None
    values = {**vars(run), "run": run.path.name, "final": run.final, "stable": stable}
    return {column: values[column] for column in RUN_COLUMNS}


def write_runs_csv(runs: list[Run], path: Path) -> None:
    """The study's per-run table (``<page>_runs.csv`` beside its report's page): one row per
    run, sorted, so that a reader can recompute every table of the report from it, and the
    report can be run on it (:func:`read_runs` takes the file in place of the run directories)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((run_row(r) for r in runs), key=lambda row: row["run"])
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RUN_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)


def write_page(lines: list[str], runs: list[Run], page: Path) -> None:
    """A report's page (Markdown ``lines``) and, beside it, the per-run table it was made from
    (``<page>_runs.csv``)."""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines) + "\n")
    write_runs_csv(runs, page.with_name(f"{page.stem}_runs.csv"))


def read_runs_csv(path: Path) -> list[Run]:
    """The runs of a per-run table (:func:`write_runs_csv`): their final and stable-phase
    losses and axes; no curves or diagnostics (the figures need the run directories)."""

    def number(text: str, kind=float):
        return None if text == "" else kind(text)

    runs = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            steps, stable_end = int(row["steps"]), number(row["stable_end"], int)
            val = {stable_end: number(row["stable"])} if row["stable"] else {}
            if row["final"]:
                val[steps] = float(row["final"])
            runs.append(
                Run(
                    path=Path(path).parent / row["run"],
                    activation=row["activation"],
                    init=row["init"],
                    width=int(row["width"]),
                    optimizer=row["optimizer"],
                    rate=float(row["rate"]),
                    lr=float(row["lr"]),
                    seed=int(row["seed"]),
                    params=int(row["params"]),
                    tokens_per_step=int(row["tokens_per_step"]),
                    val=val,
                    steps=steps,
                    stable_end=stable_end,
                    diverged=row["diverged"] == "True",
                )
            )
    return runs


def read_runs(paths) -> list[Run]:
    """The runs among ``paths`` that have written metrics (a run not yet started is skipped),
    and the rows of any per-run table (a ``.csv`` :func:`write_runs_csv` wrote) among them; a
    report's arguments with none are refused."""
    runs = []
    for p in map(Path, paths):
        if p.suffix == ".csv" and p.is_file():
            runs += read_runs_csv(p)
        elif (p / "metrics.jsonl").is_file():
            runs.append(read_run(p))
    if not runs:
        raise SystemExit(
            "no run directory with metrics.jsonl, nor a per-run .csv, among the arguments"
        )
    return runs


def best_runs(runs: list[Run], base: int, selection_seed: int = 0) -> dict[tuple[str, str], Run]:
    """(activation, optimizer) -> its run with the lowest final validation loss among ``runs``
    under µP at width ``base`` on the selection seed (a diverged run loses to every finished
    one; a tie goes to the lower rate, then the lower ``optim.lr``)."""
    candidates: dict[tuple[str, str], list[tuple[float, float, float, Run]]] = {}
    for r in runs:
        ended = r.final is not None or r.diverged
        if r.init == "mup" and r.width == base and r.seed == selection_seed and ended:
            loss = r.final if r.final is not None and not r.diverged else float("inf")
            point = (loss, r.rate, r.lr, r)
            candidates.setdefault((r.activation, r.optimizer), []).append(point)
    return {arm: min(points, key=lambda p: p[:3])[3] for arm, points in candidates.items()}


def best_rates(runs: list[Run], base: int, selection_seed: int = 0) -> dict[tuple[str, str], float]:
    """(activation, optimizer) -> the rate (``Run.rate``) of its best run (:func:`best_runs`)."""
    return {arm: run.rate for arm, run in best_runs(runs, base, selection_seed).items()}


def chosen_rates(runs: list[Run], base: int, selection_seed: int = 0) -> dict[str, float]:
    """activation -> the rate a report reads its runs at, among runs of one optimizer: the best
    on the selection seed at the base width (:func:`best_rates`), or, where the runs hold no
    such run of it, the one rate they train it at (a second stage read on its own, or its
    per-run table). An activation trained at several rates with no selection run has none:
    which of them is its tuned one is not guessed."""
    rates = {
        activation: rate for (activation, _), rate in best_rates(runs, base, selection_seed).items()
    }
    for activation in {r.activation for r in runs} - set(rates):
        trained = {r.rate for r in runs if r.activation == activation}
        if len(trained) == 1:
            rates[activation] = trained.pop()
    return rates


def rate_setting(runs: list[Run]) -> str:
    """The setting the runs' rates are values of (``optim.lr``, or ``optim.muon.lr`` under
    Muon). A report compares activations under one optimizer: runs of several are refused,
    naming them, since their rates are not values of one setting."""
    optimizers = sorted({r.optimizer for r in runs})
    if len(optimizers) > 1:
        raise SystemExit(
            f"these runs use {len(optimizers)} optimizers ({', '.join(optimizers)}): a report "
            "compares activations under one; pass each optimizer's runs on their own"
        )
    return OptimConfig(name=optimizers[0]).tuned_rate
