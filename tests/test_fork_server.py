"""tests/fork_server.py, the launcher most of the tests' ``train.py`` processes go through: a
forked process must look to its caller like ``python SCRIPT ARGS`` started there (arguments,
working directory, environment, ``__main__``, exit code, death by a signal, the signals the
caller sends), and die with its client."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

import fork_server
from train_helpers import FORK_SERVER, TEST_ENVIRONMENT, server_address

# marked slow: the server imports torch and the project, once per pytest worker
HANG = 120  # seconds: past this a process that should have ended is a hang


def script(tmp_path, body: str):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


def start(path, *args, env: dict | None = None, cwd=None, **popen) -> subprocess.Popen:
    environment = {**os.environ, **TEST_ENVIRONMENT, fork_server.ADDRESS: server_address()}
    return subprocess.Popen(
        [sys.executable, str(FORK_SERVER), str(path), *args],
        env={**environment, **(env or {})},
        cwd=cwd or path.parent,
        stdout=subprocess.PIPE,
        text=True,
        **popen,
    )


REPORT = """
    import json, os, sys
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
        "variable": os.environ.get("XIELU_PROBE"), "pid": os.getpid(),
        "preloaded": "torch" in sys.modules,
    }))
    sys.exit(3)
"""


def test_only_variables_read_when_a_run_starts_may_differ_from_the_servers():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    set_by_imports = {"TORCHINDUCTOR_CACHE_DIR": "/cache"}

    def differs(**env):
        return fork_server.differs_at_import({**base, **env}, base, set_by_imports)

    assert differs(RANK="1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="x", XIELU_PLUGINS="p") == []
    assert differs(PYTEST_CURRENT_TEST="test_x (call)") == []  # pytest sets it per test
    assert differs(TORCHINDUCTOR_CACHE_DIR="/cache") == []  # handed on by a forked agent
    assert differs(TORCHINDUCTOR_CACHE_DIR="/other") == ["TORCHINDUCTOR_CACHE_DIR"]
    assert differs(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="2") == ["HF_HUB_OFFLINE", "OMP_NUM_THREADS"]
    assert fork_server.differs_at_import({"PATH": "/bin"}, base, {}) == ["OMP_NUM_THREADS"]


@pytest.mark.slow
def test_a_forked_run_sees_its_arguments_folder_environment_and_exits_with_its_code(tmp_path):
    path = script(tmp_path, REPORT)
    (tmp_path / "elsewhere").mkdir()
    process = start(path, "a", "b=1", env={"XIELU_PROBE": "x"}, cwd=tmp_path / "elsewhere")
    output, _ = process.communicate(timeout=HANG)
    seen = json.loads(output)
    assert process.returncode == 3
    assert seen["argv"] == [str(path), "a", "b=1"]
    assert seen["cwd"] == str(tmp_path / "elsewhere")
    assert seen["name"] == "__main__" and seen["path0"] == str(tmp_path)
    assert seen["variable"] == "x"
    assert seen["preloaded"] and seen["pid"] != process.pid  # a fork of the server


@pytest.mark.slow
def test_launches_still_fork_after_a_test_changed_this_process_environment(tmp_path, monkeypatch):
    """In the suite, in-process tests leave variables behind (importing scikit-learn sets
    KMP_DUPLICATE_LIB_OK): every launch after them ran a fresh interpreter."""
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "True")
    process = start(script(tmp_path, REPORT))
    output, _ = process.communicate(timeout=HANG)
    assert json.loads(output)["preloaded"]


@pytest.mark.slow
def test_an_environment_that_differs_at_import_runs_a_fresh_interpreter(tmp_path):
    process = start(script(tmp_path, REPORT), env={"HF_HUB_OFFLINE": "1"})  # read at import
    output, _ = process.communicate(timeout=HANG)
    seen = json.loads(output)
    assert process.returncode == 3
    assert not seen["preloaded"] and seen["pid"] == process.pid  # exec'd in place


@pytest.mark.slow
def test_a_forked_run_killed_by_a_signal_kills_its_client_with_it(tmp_path):
    process = start(script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"))
    process.communicate(timeout=HANG)
    assert process.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_a_signal_to_the_client_reaches_the_forked_run_and_its_process_group(tmp_path):
    """As torchrun's killpg reaches a rank and its data workers."""
    body = """
        import signal, subprocess, sys
        below = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # held until sigwait
        print("ready", flush=True)
        signal.sigwait([signal.SIGTERM])
        print(below.wait(), flush=True)
        sys.exit(75)
    """
    process = start(script(tmp_path, body))
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=HANG)
    assert process.returncode == 75
    assert output.strip() == str(-signal.SIGTERM)  # the process below got it too


def test_a_signal_for_a_forked_run_that_has_ended_is_not_an_error():
    """torchrun sends SIGTERM to every rank once one has exited; a rank's fork can have ended
    just before, and its client must still exit with the fork's status (seen in CI: the client
    died of ProcessLookupError and the rank's 75 was reported as 1)."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ended.wait()
    fork_server.signal_group(ended.pid, signal.SIGTERM)  # its group is gone: nothing to do


@pytest.mark.slow
def test_killing_the_client_kills_the_forked_run_and_what_it_started(tmp_path):
    body = """
        import os, signal, subprocess, sys
        below = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        print(os.getpid(), below.pid, flush=True)
        signal.pause()
    """
    process = start(script(tmp_path, body))
    pids = [int(pid) for pid in process.stdout.readline().split()]
    handles = [os.pidfd_open(pid) for pid in pids]
    process.kill()
    process.wait(timeout=HANG)
    for handle in handles:  # a pidfd becomes readable when its process has ended
        readable, _, _ = select.select([handle], [], [], HANG)
        assert readable, "a process of the killed client's run is still alive"
        os.close(handle)


ENDING = """
    import atexit, sys, threading

    def after_the_main_thread():
        threading.main_thread().join()
        print("thread done", flush=True)

    threading.Thread(target=after_the_main_thread).start()  # not a daemon: waited for
    atexit.register(print, "atexit ran", flush=True)
    print("forked" if "torch" in sys.modules else "fresh")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("last_line", "code", "message"),
    [
        ("pass", 0, None),
        ("sys.exit(4)", 4, None),
        ("sys.exit('refused: a reason')", 1, "refused: a reason"),
        ("raise ValueError('broken')", 1, "ValueError: broken"),
        ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ],
)
def test_a_forked_run_ends_as_the_interpreter_ends_a_script(tmp_path, last_line, code, message):
    """Threads joined, then the atexit functions, the same exit status and message as a
    fresh interpreter gives, before the teardown the fork skips (``end_without_teardown``)."""
    path = script(tmp_path, f"{ENDING}    {last_line}\n")
    outputs = []
    for env in ({}, {"HF_HUB_OFFLINE": "1"}):  # forked, then fresh (read at import: no fork)
        process = start(path, env=env, stderr=subprocess.PIPE)
        output, error = process.communicate(timeout=HANG)
        assert process.returncode == code, error
        assert (message in error) if message else error == ""
        outputs.append(output.splitlines())
    forked, fresh = outputs
    assert forked[0] == "forked" and fresh[0] == "fresh"
    assert forked[1:] == fresh[1:] == ["thread done", "atexit ran"]
