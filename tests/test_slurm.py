"""The sbatch script: valid shell, and the torchrun command it builds from SLURM's variables."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "train.sbatch"


def test_sbatch_script_is_valid_shell():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", "-S", "warning", str(SCRIPT)], check=True)


@pytest.mark.parametrize("nodes", [2, 4096])
def test_sbatch_launches_one_torchrun_per_node_with_a_rendezvous_on_the_first(tmp_path, nodes):
    """With 4096 nodes, scontrol's list is longer than a pipe's buffer: a reader of the first
    line only would leave scontrol to die of SIGPIPE, which pipefail turns into the job's exit."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        f'#!/bin/bash\nfor i in $(seq -w 1 {nodes}); do echo "gh-$i"; done\n'
    )
    # srun runs its command locally, with python replaced by an echo of its arguments
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
        f'PATH="{bin_dir}/fake:$PATH" exec "$@"\n'
    )
    (bin_dir / "fake").mkdir()
    (bin_dir / "fake" / "python").write_text('#!/bin/sh\necho "python $*"\n')
    for f in [*bin_dir.glob("*"), *(bin_dir / "fake").glob("*")]:
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "77",
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": f"gh-[1-{nodes}]",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SCRATCH": str(tmp_path),
    }
    out = subprocess.run(
        ["bash", str(SCRIPT), "experiment=paper_1b", "activation=xielu", "data.paths=[/d/*.pq]"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    command = out.strip().splitlines()[-1].split()
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert f"--nnodes={nodes}" in command and "--nproc_per_node=4" in command
    first = "gh-" + "1".zfill(len(str(nodes)))  # seq -w pads to the widest number
    assert f"--rdzv_endpoint={first}:29500" in command and "--rdzv_id=77" in command
    assert command[-4:] == [
        "train.py",
        "experiment=paper_1b",
        "activation=xielu",
        "data.paths=[/d/*.pq]",
    ]


@pytest.mark.parametrize("directive", ["--signal=USR1@", "--requeue", "--gpus-per-node=4"])
def test_sbatch_asks_for_preemption_signal_and_requeue(directive):
    assert f"#SBATCH {directive}" in SCRIPT.read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_slurm(bin_dir: Path, nodes: int) -> Path:
    """``srun`` that starts its command once per node as background tasks (with the variables
    srun sets for a step's tasks) and records its own options; ``scontrol`` that names every
    node 127.0.0.1; ``python`` this interpreter."""
    bin_dir.mkdir()
    log = bin_dir.parent / "srun.log"
    # --kill-on-bad-exit: the first task that fails takes the other tasks down. Only the tasks
    # (torchrun's agents), unlike SLURM's cgroup: the ranks, in sessions of their own, must
    # then end by themselves (a rank whose peer died used to hang at exit on its data worker)
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        f'echo "$@" >> {log}\n'
        'while [[ "$1" == --* ]]; do shift; done\n'
        "pids=()\n"
        f"for ((i = 0; i < {nodes}; i++)); do\n"
        f"  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS={nodes} "
        '"$@" &\n'
        "  pids+=($!)\n"
        "done\n"
        "code=0\n"
        "while true; do\n"
        "  wait -n; status=$?\n"
        "  if ((status == 127)); then break; fi\n"
        "  if ((status != 0)); then\n"
        "    code=$status\n"
        '    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done\n'
        "  fi\n"
        "done\n"
        "exit $code\n"
    )
    (bin_dir / "scontrol").write_text(
        f"#!/bin/sh\nfor i in $(seq {nodes}); do echo 127.0.0.1; done\n"
    )
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return log


@pytest.mark.slow
@pytest.mark.e2e
def test_the_sbatch_script_trains_and_resumes_on_two_nodes_like_one_node(corpus, tmp_path):
    """slurm/train.sbatch with a fake srun for a 2-node job: two torchrun agents (--nnodes=2,
    c10d rendezvous on 127.0.0.1) start one rank each; the run checkpoints, a second job
    resumes it, and the losses equal a single-node torchrun with the same 2 ranks."""
    from faults import faults_env
    from train_helpers import ROOT, losses, run_launched, tiny_overrides

    log = _fake_slurm(tmp_path / "bin", nodes=2)
    extra = {"data.num_workers": 1, "trainer.steps": 8, "checkpoint.every": 4}
    single_dir = tmp_path / "single"
    code, output = run_launched(
        tiny_overrides(corpus, single_dir, **extra), torchrun=2, timeout=240
    )
    assert code == 0, output[-3000:]
    run_dir = tmp_path / "two_nodes"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SCRATCH")},
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "2",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "GPUS_PER_NODE": "1",
        "RDZV_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
        "HOME": str(tmp_path),
    }
    first = tiny_overrides(corpus, run_dir, **extra)
    done = subprocess.run(
        ["bash", str(SCRIPT), *first],
        env={**env, **faults_env(signal="SIGKILL@6@1")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0  # rank 1 killed at step 6: the step fails, as on a cluster
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000004"]
    done = subprocess.run(
        ["bash", str(SCRIPT), *tiny_overrides(corpus, run_dir, **extra)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr
    assert losses(run_dir) == pytest.approx(losses(single_dir), rel=1e-6)
    assert log.read_text().count("--cpus-per-task=2 ") == 2  # both jobs' srun


@pytest.mark.slow
def test_plain_python_inside_an_allocation_runs_one_process(corpus, tmp_path):
    """The batch script (or an salloc shell) of an 8-task job sees SLURM_NTASKS=8 but is not a
    step's task: it used to become rank 0 of 8 and wait for 7 peers that never came."""
    from train_helpers import run, tiny_overrides

    env = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    code, output = run(
        tiny_overrides(corpus, tmp_path, **{"trainer.steps": 6}), env=env, timeout=120
    )
    assert code == 0, output[-3000:]
    assert "single process" in output
