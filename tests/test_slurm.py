"""The sbatch script: valid shell, and the torchrun command it builds from SLURM's variables."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "train.sbatch"


def test_sbatch_script_is_valid_shell():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", "-S", "warning", str(SCRIPT)], check=True)


def test_sbatch_launches_one_torchrun_per_node_with_a_rendezvous_on_the_first(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\nprintf "gh-001\\ngh-002\\n"\n')
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
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gh-[001-002]",
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
    assert "--nnodes=2" in command and "--nproc_per_node=4" in command
    assert "--rdzv_endpoint=gh-001:29500" in command and "--rdzv_id=77" in command
    assert command[-4:] == [
        "train.py",
        "experiment=paper_1b",
        "activation=xielu",
        "data.paths=[/d/*.pq]",
    ]


@pytest.mark.parametrize("directive", ["--signal=USR1@", "--requeue", "--gpus-per-node=4"])
def test_sbatch_asks_for_preemption_signal_and_requeue(directive):
    assert f"#SBATCH {directive}" in SCRIPT.read_text()
