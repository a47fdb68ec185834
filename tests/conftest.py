"""Test-wide settings.

- ``XIELU_BACKEND=eager``: the fused ops' ``auto`` backend would compile a CPU kernel (~30 s on
  first use); tests that mean to exercise the compiled or Triton kernels ask for them by name.
- ``TRITON_INTERPRET=1`` on machines without CUDA, so the Triton kernels run on CPU tensors
  through Triton's interpreter. It must be set before the kernels are defined (import time).
"""

import os
import signal
import sys

import pytest
import torch

os.environ.setdefault("XIELU_BACKEND", "eager")
# one thread everywhere: in-process runs and the subprocesses they are compared with
# (train_helpers.launch) reduce in the same order, and pytest-xdist's two workers each get a core
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests import helpers (tests/data_fixtures.py) and scripts as modules
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)


def pytest_collection_modifyitems(config, items):
    """Slow tests first (stable order otherwise), so that with two xdist workers the longest
    runs (the quickstart's ~90 s) start at once and overlap the many quick tests, rather than
    finishing alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item):
    """A test marked ``shared_data`` reads the real samples beside the repository, which a
    user's clone does not have: skipped there, saying so."""
    if item.get_closest_marker("shared_data"):
        from data_fixtures import SHARED

        if not SHARED.is_dir():
            pytest.skip(f"reads the optional real samples in {SHARED}, which are absent")


def pytest_configure(config):
    """pytest-xdist's ``loadgroup`` keeps an ``xdist_group`` on one worker under pytest 8; under
    pytest 9 (with xdist 3.8) it splits the group over the workers in silence, and a group's
    module fixtures (the compiled kernels of ``tests/test_kernel_code.py``) are built on both.
    Refuse to run so rather than run slowly (pyproject.toml pins pytest below 9)."""
    if config.getoption("dist", None) == "loadgroup" and pytest.version_tuple[0] >= 9:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} splits pytest-xdist's loadgroup groups: install the "
            "pinned test tools (pip install -c constraints/cpu.txt -e '.[dev]')"
        )


@pytest.fixture(autouse=True)
def signal_actions_restored():
    """The stop signals' actions as they were before each test. A run in this process that
    stopped for a signal leaves SIGTERM ignored, on purpose (``Preemption.uninstall``), and an
    ignored signal stays ignored in every process started afterwards: a later test's
    subprocess could not be killed by SIGTERM."""
    from training.runtime.preemption import REQUEUE_SIGNALS, STOP_SIGNALS

    before = {sig: signal.getsignal(sig) for sig in (*REQUEUE_SIGNALS, *STOP_SIGNALS)}
    yield
    for sig, action in before.items():
        signal.signal(sig, action)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches empty before and after: a test's compilations neither count towards the
    recompile limit of a later one nor reuse an earlier one's."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real documents as parquet files of several row groups (tests/data_fixtures.py)."""
    from data_fixtures import write_parquet_corpus

    directory = tmp_path_factory.mktemp("corpus")
    write_parquet_corpus(directory, files=3, row_group_size=20)
    return directory


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted 12-step tiny run: (run dir, loss per step), what resumed runs repeat."""
    from train_helpers import losses, run_in_process, tiny_overrides

    run_dir = tmp_path_factory.mktemp("reference")
    assert run_in_process(tiny_overrides(corpus, run_dir)) == 0
    return run_dir, losses(run_dir)
