"""A property of the run directory: nothing the trainer does to it, or has done to it, loses work.

A seeded random sequence of what happens to a run on a cluster: starts on 1 or 2 processes,
DDP or FSDP2, fp32 or bf16 (a resume may change all of these); a stop (SIGTERM) or a kill
(SIGKILL) sent from outside to every process of the job, as a scheduler does, once the run has
logged a given step; a restart with a change a resume may not make (refused); a checkpoint file
cut short on disk. After each event:

- no checkpoint whose bytes are intact was set aside (``.corrupt``);
- a start resumed from the newest intact checkpoint (nothing lost beyond it), and a stop lost
  nothing at all;
- ``metrics.jsonl`` holds each step once, 1 to the last one trained, with no gap;
- the run's configuration (what readers see) is that of its newest checkpoint;
- a refused change (a key a resume may not change, a non-finite setting, data that cannot feed
  a step) exited non-zero and left the directory byte for byte as it was, or absent.

Three sequences run in the suite. More, as a stress test outside it:

    XIELU_STRESS_SEQUENCES=30 python -m pytest tests/test_run_directory_property.py -n 0 -q
"""

from __future__ import annotations

import contextlib
import gzip
import os
import random
import re
import signal
import subprocess
from collections import Counter

import pytest

from end_to_end import LOCAL_CORPUS
from train_helpers import descendants, kill_tree, launch, metrics, snapshot
from training.checkpoint import checkpoint_config, complete_checkpoints, run_config

SEQUENCES = int(os.environ.get("XIELU_STRESS_SEQUENCES", "3"))
EVENTS = 5
BAD_INPUT_AT = 2  # every sequence: a start with bad input (tests/test_refused_starts.py) here
STEPS = 10
TIMEOUT = 300  # one start of this tiny run takes seconds: past this it hangs
STEP_LINE = re.compile(r"^step\s+(\d+) \|")
RESUMED = re.compile(r"resumed from \S+/step_(\d+) at step")

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def overrides(run_dir, layout: tuple[int, str, str], *extra: str) -> list[str]:
    _, parallelism, precision = layout
    values = {
        "model.dim": 32,
        "model.n_layers": 2,
        "model.n_heads": 2,
        "model.gated_hidden": 64,
        "model.max_seq_len": 32,
        "data": "local",
        "data.paths": f"[{LOCAL_CORPUS}/*.json.gz]",
        "data.seq_len": 32,
        "data.num_workers": 0,
        "data.validation_documents": 4,
        "trainer.global_batch": 4,
        "trainer.micro_batch": 1,
        "trainer.steps": STEPS,
        "parallel.strategy": parallelism,
        "parallel.precision": precision,
        "trainer.log_every": 1,
        "checkpoint.every": 2,
        "checkpoint.keep": 3,
        "validation.every": 0,
        "logging.diagnostics_every": 0,
        "logging.grad_norms_every": 0,
        "schedule.warmup_steps": 2,
        "schedule.decay_steps": 2,
        "logging.wandb.mode": "disabled",
        "trainer.run_dir": str(run_dir),
    }
    values.update(item.split("=", 1) for item in extra)  # an extra key replaces the base's
    return [f"{k}={v}" for k, v in values.items()]


# the second sequence reads a mixture (the c4 sample, inheriting data.paths, and the builtin
# corpus's reference half) with the batch doubling at step 5: they too must survive every event
MIXTURE_AND_RAMP = (
    "data=mixture",
    "data.sources=[{name: c4, source: local, weight: 0.6}, {name: reference, source: builtin,"
    " weight: 0.4, builtin_part: reference, validation_documents: 20}]",
    "trainer.batch_ramp=[{tokens: 640, global_batch: 8}]",
)


def start(run_dir, layout, *extra: str, stop: tuple[signal.Signals, int] | None = None):
    """(exit code, output) of one start; ``stop``: (signal, step) sent from outside to every
    process of the job once the console shows that step (read as it comes, no polling)."""
    nprocs = layout[0]
    torchrun = nprocs if nprocs > 1 else 0
    # the signals go to each process of the job, as a scheduler sends them
    process = launch(overrides(run_dir, layout, *extra), torchrun=torchrun)
    lines, sent = [], False
    try:
        for line in process.stdout:
            lines.append(line)
            match = STEP_LINE.match(line)
            if stop and not sent and match and int(match.group(1)) >= stop[1]:
                for pid in [process.pid, *descendants(process.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, stop[0])
                sent = True
        process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        raise AssertionError("a start hung:\n" + "".join(lines)[-5000:]) from None
    return process.returncode, "".join(lines)


class Run:
    """The run directory and what the test knows it should hold."""

    def __init__(self, run_dir) -> None:
        self.dir = run_dir
        self.damaged: set[str] = set()  # published checkpoints the test cut short
        self.aside: Counter[str] = Counter()  # how many of each step the trainer may set aside

    def corrupt(self) -> Counter[str]:
        root = self.dir / "checkpoints"
        names = root.iterdir() if root.is_dir() else []
        return Counter(p.name.split(".")[0] for p in names if ".corrupt" in p.name)

    def after_start(self) -> None:
        """A damaged checkpoint the trainer set aside is no longer published: a later save of
        the same step is a new, intact one."""
        corrupt = self.corrupt()
        for name in list(self.damaged):
            if corrupt[name] > self.aside[name]:
                self.damaged.discard(name)
                self.aside[name] += 1

    def intact(self) -> list[int]:
        return [
            int(p.name.split("_")[1])
            for p in complete_checkpoints(self.dir)
            if p.name not in self.damaged
        ]

    def check(self, output: str = "") -> None:
        wrongly = self.corrupt() - self.aside
        assert not wrongly, f"intact checkpoints set aside: {dict(wrongly)}"
        steps = [m["step"] for m in metrics(self.dir) if "loss" in m]
        assert steps == list(range(1, len(steps) + 1)), f"steps logged: {steps}\n{output[-3000:]}"
        newest = complete_checkpoints(self.dir)
        if newest:
            assert run_config(self.dir) == checkpoint_config(newest[-1])
            assert run_config(self.dir).model.dim == 32  # never a refused start's


@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_no_sequence_of_starts_stops_kills_and_damage_loses_work(seed, tmp_path):
    rng = random.Random(seed)
    run = Run(tmp_path / "run")
    empty = tmp_path / "empty.json.gz"  # a file of the corpus's kind with no document in it
    empty.write_bytes(gzip.compress(b""))
    bad_input = [
        "optim.lr=nan",
        "optim.grad_clip=inf",
        f"data.paths=[{empty}]",
        "data.source=builtin",  # beside data.paths, which it would not read
        "+model.activation_kwargs.foo=1",
        "optim.weight_decay=1000",  # x optim.lr: every weight flipped each step
    ]
    base = MIXTURE_AND_RAMP if seed % 3 == 1 else ()
    history = []
    for i in range(EVENTS):
        layout = (rng.choice([1, 2]), rng.choice(["ddp", "fsdp"]), rng.choice(["fp32", "bf16"]))
        event = rng.choice(["run", "stop", "kill", "refused", "damage"])
        if i == BAD_INPUT_AT:
            event = "bad input"
        history.append((event, layout))
        where = f"seed {seed}, events so far: {history}"
        intact = run.intact()
        if event == "damage":
            if intact:
                newest = run.dir / "checkpoints" / f"step_{intact[-1]:06d}"
                shard = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
                shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
                run.damaged.add(newest.name)
            run.check()
            continue
        if event in ("refused", "bad input"):
            change = rng.choice(
                bad_input
                if event == "bad input"
                else (["model.dim=48", "optim.lr=0.001"] if intact else [])
                + ["data.paths=[/nowhere/*.json.gz]", *bad_input]
            )
            history[-1] = (event, layout, change)
            before = snapshot(run.dir) if run.dir.exists() else None
            code, output = start(run.dir, layout, *base, change)
            run.after_start()
            assert code != 0, f"{where}: {change} was accepted\n{output[-3000:]}"
            after = snapshot(run.dir) if run.dir.exists() else None
            assert after == before, where
            run.check(output)
            continue
        if run.damaged & {p.name for p in complete_checkpoints(run.dir)} and not intact:
            before = snapshot(run.dir)  # every checkpoint damaged: refuse, never start over
            code, output = start(run.dir, layout, *base)
            run.after_start()
            assert code != 0 and "none of its" in output, f"{where}\n{output[-3000:]}"
            assert snapshot(run.dir) == before, where
            continue
        stop = None
        if event != "run":
            stop = (signal.SIGTERM if event == "stop" else signal.SIGKILL, rng.randint(1, STEPS))
        code, output = start(run.dir, layout, *base, stop=stop)
        run.after_start()
        resumed = [int(m) for m in RESUMED.findall(output)]
        expected = intact[-1] if intact else None
        assert resumed == ([expected] if expected else []), f"{where}\n{output[-3000:]}"
        trained = [m["step"] for m in metrics(run.dir) if "loss" in m]
        if event == "run" or (trained and trained[-1] == STEPS and code == 0):
            assert code == 0, f"{where}\n{output[-3000:]}"
            assert trained[-1] == STEPS and run.intact()[-1] == STEPS
        elif event == "stop":  # checkpointed on the way out: nothing lost
            assert run.intact()[-1] == trained[-1], f"{where}\n{output[-3000:]}"
        run.check(output)
    if base and run.intact():  # the sequence did train the mixture, at the ramp's batches
        assert [e.name for e in run_config(run.dir).data.sources] == ["c4", "reference"]
        batches = {m["step"]: m["global_batch"] for m in metrics(run.dir) if "loss" in m}
        assert all(batch == (4 if step <= 5 else 8) for step, batch in batches.items())
