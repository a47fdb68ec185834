"""What each stop signal means under SLURM, with DataLoader workers running (README's fault table).

SIGUSR1/SIGUSR2: checkpoint, ``scontrol requeue``, exit 75. SIGTERM: checkpoint, exit 75, no
requeue (scancel; a scheduler preemption requeues by itself). A fake ``scontrol`` on PATH
records what it was asked.
"""

import os
import signal

import pytest

from faults import faults_env
from train_helpers import launch, losses, run, tiny_overrides

pytestmark = pytest.mark.slow

REQUEUED = 75


@pytest.fixture
def slurm(tmp_path):
    """SLURM's job id, and a fake scontrol whose calls land in the returned log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    scontrol.chmod(0o755)
    env = {"SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, log


@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2", "SIGTERM"])
def test_each_signal_checkpoints_and_requeues_only_when_it_asks_for_it(
    corpus, tmp_path, slurm, sig
):
    env, log = slurm
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        corpus,
        run_dir,
        **{
            "trainer.steps": 100000,
            "checkpoint.every": 0,
            "validation.every": 0,
        },
    )
    code, output = run(overrides, env={**env, **faults_env(signal=f"{sig}@3")}, timeout=120)
    assert code == REQUEUED, output
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    assert checkpoint.name == "step_000003" and max(losses(run_dir)) == 3
    if sig == "SIGTERM":
        assert not log.exists() and "not requeued" in output
    else:
        assert log.read_text().split() == ["requeue", "4242"]


def test_sigterm_to_the_whole_step_with_workers_checkpoints_and_the_rerun_repeats_the_losses(
    corpus, tmp_path, slurm
):
    """slurmstepd signals every process of the step, DataLoader workers included. A worker that
    died of it stopped the main process mid-step ("DataLoader worker ... killed by signal"):
    exit 1, no checkpoint."""
    env, log = slurm
    workers = {"data.num_workers": 1, "trainer.steps": 40, "schedule.decay_steps": 5}
    reference_dir = tmp_path / "reference"
    code, output = run(tiny_overrides(corpus, reference_dir, **workers), env=env)
    assert code == 0, output
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(corpus, run_dir, **workers, **{"checkpoint.every": 0})
    process = launch(overrides, env=env)  # its process group is the job's
    seen = []
    for line in process.stdout:  # signal once step 3 is logged, as a scheduler would at any time
        seen.append(line)
        if line.startswith("step      3 |"):
            os.killpg(process.pid, signal.SIGTERM)
            break
    output = "".join(seen) + process.communicate(timeout=120)[0]
    assert process.returncode == REQUEUED, output
    assert "killed by signal" not in output
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    assert 3 <= int(checkpoint.name.removeprefix("step_")) < 40
    assert not log.exists()  # SIGTERM does not requeue
    code, output = run(overrides, env=env)
    assert code == 0, output
    assert losses(run_dir) == losses(reference_dir)


@pytest.mark.parametrize("checkpointed, expected", [(True, REQUEUED), (False, -signal.SIGTERM)])
def test_a_rank_whose_stop_is_checkpointed_exits_75_on_a_later_sigterm(checkpointed, expected):
    """torchrun sends SIGTERM to the ranks still shutting down once one has exited 75: with the
    handlers restored they died of it (-15, seen in the end-to-end tier) though their part was
    saved. A checkpointed stop ignores it and keeps its exit code, through the interpreter's
    finalization too (which puts back the default action of handled signals); an ordinary exit
    keeps the default action."""
    import subprocess
    import sys

    from train_helpers import ROOT

    code = (
        "import os, signal\n"
        "from training.runtime.preemption import Preemption\n"
        "p = Preemption()\n"
        "p.install()\n"
        f"p.checkpointed = {checkpointed}\n"
        "p.uninstall()\n"
        "import atexit\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))  # while finalizing\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "raise SystemExit(75)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120)
    assert result.returncode == expected
