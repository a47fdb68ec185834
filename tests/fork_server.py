"""A fork server for the tests' ``train.py`` launches: a process that has imported torch, the
project and what a run imports, and forks a copy of itself for each launch instead of starting a
fresh interpreter.

Why: the end-to-end tier is about 60 launches of ``torchrun`` with 2 ranks, and on the 2-core
CI machine each process spent seconds importing the same modules (torch, Dynamo, lm-eval,
``datasets``, the checkpoint code) and faulting in the same library pages before its first step.
A forked copy starts with all of that done and shares those pages.

What stays as a cluster runs it: torchrun is the launcher, each rank is its own process with
its own pid, environment, working directory, standard streams and exit code, and it runs
``train.py`` as ``__main__`` from an interpreter in which nothing else has run. A launch goes
through a **client** (this file run as a script, standard library only, milliseconds to start)
which takes the place of ``python``: ``python tests/fork_server.py train.py ARGS`` or, in
torchrun's command, ``tests/fork_server.py`` as the training script. The client hands the server
its argument list, environment, working directory and standard streams, forwards the signals it
receives to the forked process, and exits as it did (the same code, or killed by the same
signal). A client that dies (SIGKILL) takes its forked process and everything under it along.

What differs, and how the tests deal with it:

- An environment that differs from the server's in a variable an import may read (anything but
  torchrun's per-rank variables, the project's ``XIELU_*`` and pytest's ``PYTEST_*``) cannot
  be forked: the client runs a fresh interpreter instead, by ``exec``, with the same pid. (A
  change to the pytest process's own environment starts another server: ``address``.)
- The forked process is not below its client in the process tree, and is in a session of its
  own (as torchrun starts a rank). A signal the client receives is forwarded to that session's
  process group, as torchrun's ``killpg`` reaches a rank and its data workers; a signal sent
  from outside straight to a rank's data worker has no such path.
- A forked process's command line (``/proc/PID/cmdline``, ``ps``) is the server's.
- Forked processes write unbuffered (``python -u``), as torchrun's ranks do.
- A forked process ends as the interpreter ends (its non-daemon threads joined, its ``atexit``
  functions run, its streams flushed) but without the teardown after that (``os._exit``): a
  crash or hang inside the freeing of modules would not show. The server's objects are frozen
  (``gc.freeze``), so no collection in a fork walks them.

So the tests that send signals from outside (``tests/test_run_directory_property.py``,
``tests/test_signals.py``) or look for a run's processes by their command line
(``tests/test_faults.py``'s kill -9) launch without the server
(``train_helpers.launch(..., forked=False)``), as does README's quickstart test, which runs
``train.py`` as a user does (``as_shipped``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import sys
from pathlib import Path

ADDRESS = "XIELU_TEST_FORK_SERVER"  # the server's socket, in the environment of a launch
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# torchrun's per-rank variables, the project's own, pytest's (the test being run) and one
# Inductor sets in each process before it reads it: read when a run starts or never, so a
# forked process may have other values for them than its server has
RUN_TIME = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",  # an address that Inductor sets before reading
)
RUN_TIME_PREFIXES = (
    "GROUP_",
    "ROLE_",
    "MASTER_",
    "TORCHELASTIC_",
    "TORCH_NCCL_",
    "XIELU_",
    "PYTEST_",
)
# what a run imports, imported once by the server (the rest comes from importing train.py)
PRELOADED = (
    "torch.distributed.run",
    "torch._dynamo",
    "torch._functorch.aot_autograd",
    "torch._inductor.pattern_matcher",
    "lm_eval.api.registry",
    "lm_eval.evaluator",
    "lm_eval.tasks",
)


def read_when_a_run_starts(name: str) -> bool:
    return name in RUN_TIME or name.startswith(RUN_TIME_PREFIXES)


def differs_at_import(env: dict[str, str], base: dict[str, str], set_by_imports: dict) -> list:
    """The variables in which ``env`` differs from the server's ``base`` environment that an
    import may have read. A variable the server's imports set, with the value they set, is no
    difference: a forked torchrun agent hands it on to its ranks."""

    def differs(name: str) -> bool:
        if read_when_a_run_starts(name):
            return False
        if name not in base and name in set_by_imports:
            return env.get(name, set_by_imports[name]) != set_by_imports[name]
        return env.get(name) != base.get(name)

    return sorted(filter(differs, set(env) | set(base)))


# ---------------------------------------------------------------------------------- the client


def send(connection: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    header = len(data).to_bytes(8, "little")
    if fds:
        socket.send_fds(connection, [header], list(fds))
    else:
        connection.sendall(header)
    connection.sendall(data)


def receive(connection: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None when the other end has closed), and the descriptors sent with it."""
    if with_fds:
        header, fds, _, _ = socket.recv_fds(connection, 8, with_fds)
    else:
        header, fds = connection.recv(8, socket.MSG_WAITALL), []
    if len(header) < 8:
        return None, fds
    size = int.from_bytes(header, "little")
    data = connection.recv(size, socket.MSG_WAITALL) if size else b""
    return json.loads(data), fds


def exit_as(status: int) -> None:
    """Leave this process the way the forked one left: its exit code or its signal."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number in FORWARDED:  # this process catches it
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


def signal_group(pgid: int, number: int) -> None:
    """Send ``number`` to the forked run's process group, unless none of it is left: torchrun
    sends SIGTERM to every rank once one has exited, and a rank's fork may have exited between
    that and this (its status is on its way to the client, which exits with it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, number)


def client(argv: list[str]) -> None:
    """Run ``python ARGV`` as a fork of the server, or as ``exec python ARGV`` without one."""
    forked: list[int] = []  # the forked process's pid, once the server has sent it
    pending: list[int] = []  # signals that came before it

    def forward(number: int, _) -> None:  # to its process group, as torchrun's killpg reaches
        if forked:
            signal_group(forked[0], number)
        else:
            pending.append(number)

    for number in FORWARDED:
        signal.signal(number, forward)
    connection = socket.socket(socket.AF_UNIX)
    try:
        connection.connect(os.environ.get(ADDRESS, ""))
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        send(connection, request, fds=[0, 1, 2])
        reply, _ = receive(connection)
    except OSError:
        reply = None
    if reply is None or "pid" not in reply:  # no server, or one that cannot run this launch
        connection.close()
        for number in FORWARDED:
            signal.signal(number, signal.SIG_DFL)
        for number in pending:
            os.kill(os.getpid(), number)
        unbuffered = ["-u"] if getattr(sys.stdout, "write_through", False) else []
        os.execv(sys.executable, [sys.executable, *unbuffered, *argv])
    forked.append(reply["pid"])
    for number in pending:
        signal_group(forked[0], number)
    status, _ = receive(connection)
    if status is None:  # the server went away: say so rather than invent an exit code
        print("tests/fork_server.py: the server closed before the run ended", file=sys.stderr)
        os._exit(70)
    exit_as(status["status"])


# ---------------------------------------------------------------------------------- the server

_servers: list[tuple[dict, dict, str]] = []  # this process's: (base, set_by_imports, socket)


def address(root: Path, env: dict[str, str]) -> str:
    """The socket of a server of this process that can fork a launch with ``env``, started
    when none can: tests change the pytest process's environment for good (importing
    scikit-learn sets a variable), and no launch after such a change would fork. A server stops
    when this process ends (it reads a pipe whose only writer is this process)."""
    for base, set_by_imports, socket_path in _servers:
        if not differs_at_import(env, base, set_by_imports):
            return socket_path
    import atexit
    import shutil
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="xielu-fork-")
    socket_path = os.path.join(folder, "socket")
    read_end, write_end = os.pipe()
    command = [sys.executable, "-u", __file__, "--serve", socket_path, str(read_end), str(root)]
    server = subprocess.Popen(
        command,
        env=env,
        pass_fds=(read_end,),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a Ctrl-C at the terminal reaches it through the pipe
    )
    os.close(read_end)
    ready = server.stdout.readline()
    if not ready.startswith("{"):
        raise RuntimeError(f"tests/fork_server.py did not start: {ready!r}")
    atexit.register(lambda: (os.close(write_end), server.wait(), shutil.rmtree(folder)))
    _servers.append((env, json.loads(ready)["set_by_imports"], socket_path))
    return socket_path


def child(connection: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked process: become ``python ARGV`` started from the client's side."""
    os.setsid()  # as torchrun starts a rank: a session (and process group) of its own
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    connection.close()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    import runpy

    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code, dies_of = 0, None
    except SystemExit as stop:
        code, dies_of = exit_code(stop.code), None
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
        # as the interpreter ends after an uncaught KeyboardInterrupt: killed by SIGINT
        code, dies_of = 1, signal.SIGINT if isinstance(error, KeyboardInterrupt) else None
    end_without_teardown(code, dies_of)


def exit_code(value) -> int:
    """The exit status the interpreter gives ``sys.exit(value)`` at the top level."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def end_without_teardown(code: int, dies_of: int | None) -> None:
    """End as the interpreter does (wait for the non-daemon threads, run the ``atexit``
    functions, flush the standard streams), then ``os._exit`` without its teardown: freeing
    every module and a last collection over the server's objects, which touch every page the
    fork shares with the server (1.9 s of CPU per process on the 2-core machine, 3 processes
    per launch). ``dies_of``: a signal to die of instead of exiting with ``code``."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream, as at teardown
            stream.flush()
    if dies_of is not None:
        signal.signal(dies_of, signal.SIG_DFL)
        os.kill(os.getpid(), dies_of)
    os._exit(code)


class Server:
    """Forks a copy of this process for each launch and tells each client how its copy ended.

    ``base``: the environment the server started with, before its imports set variables of
    their own (Inductor's cache folder, for one)."""

    def __init__(self, address: str, parent_pipe: int, base: dict[str, str]):
        import selectors

        self.base = base
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in base}
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(address)
        self.listener.listen(64)
        self.wakeup = os.pipe()  # SIGCHLD writes here: a forked process ended
        os.set_blocking(self.wakeup[1], False)
        signal.set_wakeup_fd(self.wakeup[1])
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.parent_pipe = parent_pipe
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, self.accept)
        self.selector.register(self.wakeup[0], selectors.EVENT_READ, self.reap)
        self.selector.register(parent_pipe, selectors.EVENT_READ, self.stop)
        self.running: dict[int, socket.socket] = {}  # forked pid -> its client's connection
        self.watched: dict[socket.socket, int] = {}  # connections whose client is still there
        self.forked: tuple | None = None  # set in a forked process: what it is to run
        self.stopped = False

    def serve(self) -> tuple | None:
        """Until the parent's pipe closes; returns in a forked process only, with what it is
        to run."""
        print(json.dumps({"set_by_imports": self.set_by_imports}), flush=True)  # ready
        while not self.stopped and self.forked is None:
            for key, _ in self.selector.select():
                key.data(key.fileobj)
                if self.forked is not None:
                    break
        return self.forked

    def stop(self, _) -> None:
        from train_helpers import kill_tree  # this file's folder is sys.path[0] in the server

        for pid in self.running:
            kill_tree(pid)
        self.stopped = True

    def forget(self, connection: socket.socket) -> None:
        if self.watched.pop(connection, None) is not None:
            self.selector.unregister(connection)

    def client_gone(self, connection: socket.socket) -> None:
        """The client closed its end (only its death does): its forked process goes too."""
        from train_helpers import kill_tree

        pid = self.watched[connection]
        self.forget(connection)
        kill_tree(pid)

    def reap(self, _) -> None:
        os.read(self.wakeup[0], 4096)
        while self.running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            connection = self.running.pop(pid)
            self.forget(connection)
            with contextlib.suppress(OSError):  # the client is gone
                send(connection, {"status": status})
            connection.close()

    def accept(self, _) -> None:
        import selectors

        connection, _ = self.listener.accept()
        request, fds = receive(connection, with_fds=3)
        changed = ["?"]
        if request is not None:
            changed = differs_at_import(request["env"], self.base, self.set_by_imports)
        if changed:
            with contextlib.suppress(OSError):  # a client gone already
                send(connection, {"refused": changed})
            connection.close()
            for fd in fds:
                os.close(fd)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            request["env"] = {**self.set_by_imports, **request["env"]}
            self.close_in_child()
            self.forked = (connection, request, fds)
            return
        for fd in fds:
            os.close(fd)
        self.running[pid] = connection
        self.watched[connection] = pid
        self.selector.register(connection, selectors.EVENT_READ, self.client_gone)
        with contextlib.suppress(OSError):  # a client gone already: client_gone is next
            send(connection, {"pid": pid})

    def close_in_child(self) -> None:
        for connection in self.running.values():
            connection.close()
        self.selector.close()
        self.listener.close()
        for fd in (*self.wakeup, self.parent_pipe):
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def preload(root: str) -> None:
    """Import what a run imports. Then fill ``inspect``'s map of modules to files: torchrun's
    rendezvous calls ``inspect.stack()`` at each step, which maps every module in
    ``sys.modules`` the first time; done here, the forked processes inherit the map."""
    import importlib
    import inspect

    sys.path.insert(0, root)
    import train  # noqa: F401  the project and what it imports

    for name in PRELOADED:
        importlib.import_module(name)
    sys.path.remove(root)
    del sys.modules["train"]  # a launch runs it as __main__, from its file
    inspect.stack()


def main() -> None:
    if sys.argv[1:2] != ["--serve"]:
        client(sys.argv[1:])
        return
    address, parent_pipe, root = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    base = dict(os.environ)
    preload(root)
    gc.freeze()  # the server's objects: no collection in a fork walks them (copying pages)
    forked = Server(address, parent_pipe, base).serve()
    if forked is not None:
        child(*forked)
    os._exit(0)  # no teardown: the frozen objects are never freed (nanobind reports them)


if __name__ == "__main__":
    main()
