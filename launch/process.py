"""Child processes that cannot outlive the process that started them.

Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` is set in the child between fork and exec, so a
broker or a worker is killed by the kernel when its parent dies, even by SIGKILL, where no
Python cleanup runs.

A role (``asyncrl train``, ``asyncrl rollout``) is forked from a server process that has
imported torch and transformers once (:func:`spawn_role`): a fresh interpreter spends ~7 s of
CPU on those imports on a 2-core machine, at every start and every restart of every role. The
server imports nothing that starts a thread (pyarrow's allocator does: it is imported in each
child). A role still ends with the launcher: a thread of its own waits on the launcher's pidfd,
and, where there is none, the server exits with the launcher and the role with the server
(PDEATHSIG). Each forked role names itself in ``ps`` by its command (``asyncrl rollout
--config ... --worker-id 0``), not the server's.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import multiprocessing
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child die with SIGKILL when this process goes."""
    libc = _libc()
    parent = os.getpid()

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the parent died between fork and prctl
                os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for our children: never reach for a model hub; ``extra`` on top (a
    trainer rank's RANK, WORLD_SIZE, ...)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def spawn(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """Start ``cmd`` with stdout and stderr to ``log_path`` and ``env`` added to its
    environment; it dies with this process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            preexec_fn=die_with_parent(),
            close_fds=True,
        )
    return proc, log_path


PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "numpy",
    "pydantic",
    "confluent_kafka",
    "rich",
    "yaml",
]
"""What the fork server imports before it forks any role: the costly imports every role makes,
none of which starts a thread."""

_forkserver_context: Any = None


def _context() -> Any:
    """The fork server's context, started on first use with this process's environment (plus
    what ``child_env`` adds: transformers reads HF_HUB_OFFLINE when it is imported)."""
    global _forkserver_context
    if _forkserver_context is None:
        for key, value in child_env().items():
            os.environ.setdefault(key, value)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _forkserver_context = ctx
        atexit.register(_stop_role_server)  # once: the context is made once
    return _forkserver_context


def preloaded_available() -> bool:
    """Roles can be forked from a preloaded server here (Linux; not disabled by
    ``ASYNCRL_SPAWN=exec``, which starts every role as a fresh interpreter)."""
    return (
        sys.platform.startswith("linux")
        and "forkserver" in multiprocessing.get_all_start_methods()
        and os.environ.get("ASYNCRL_SPAWN", "") != "exec"
    )


def start_role_server() -> None:
    """Start the fork server now, so its imports overlap what the caller does before its
    first role (the broker's start, the topics, the prompts); returns at once.

    It starts with SIGINT ignored (an ignored signal stays so across its exec): multiprocessing
    ignores it in the server only once the preloaded imports are done, and a Ctrl-C in the
    first seconds of ``asyncrl run`` printed a page of KeyboardInterrupt traceback from inside
    ``import transformers``. The launcher ends the server itself; each role takes SIGINT back
    (``_role_main``)."""
    if preloaded_available():
        _context()
        from multiprocessing import forkserver

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            forkserver.ensure_running()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


def _stop_role_server() -> None:
    """Kill the fork server as this process exits. Left to itself it ends once it sees the
    launcher gone, through an interpreter shutdown with torch and transformers loaded
    (~0.8 s), holding the launcher's stdout and stderr meanwhile: ``asyncrl run | tee`` (or
    a test reading its output) waited that long after the launcher had exited. Its roles
    end with the launcher anyway (``_die_with``)."""
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _die_with(launcher: int) -> None:
    """Kill this process the moment ``launcher`` exits (a thread waits on its pidfd): the
    server would end it too, but only once its interpreter has shut down, ~1.5 s later, while
    this role went on consuming and publishing for a run that was gone."""
    try:
        fd = os.pidfd_open(launcher)
    except ProcessLookupError:  # gone already
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here: the server's chain alone
        return

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="die-with-launcher", daemon=True).start()


def _role_main(
    argv: list[str], log_path: str, env: dict[str, str], launcher: int, interrupt: bool
) -> None:
    """A role's process, as ``python -m asyncrl <argv>`` with its output to ``log_path``.
    ``interrupt``: whether the launcher takes SIGINT, as a role it exec'd would inherit."""
    _die_with(launcher)
    if interrupt:  # the server ignores it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The server exits once every holder of its "alive" pipe has closed it; multiprocessing
    # hands each child a copy (so the server outlives its children). Without ours, the
    # server exits when the launcher does, even by SIGKILL, and this child with it.
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None
    libc = _libc()
    if libc is not None:  # die with the fork server
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() == 1:
            os._exit(1)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True)  # type: ignore[union-attr]
    from asyncrl.telemetry.process_title import set_title

    # Not the fork server's command line, in ps; before the environment is replaced:
    # setproctitle finds the room it writes in beside the environment's strings.
    set_title(" ".join(["asyncrl", *argv]))
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["asyncrl", *argv]
    try:  # as `python -m asyncrl <argv>`, which ends in SystemExit(its exit code)
        runpy.run_module("asyncrl", run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()  # the server's child ends with os._exit: flush spans, etc.


class RoleProcess:
    """A role forked from the preloaded server, with the part of ``subprocess.Popen`` the
    launcher and the tests use (``poll``, ``wait``, ``kill``, ``terminate``,
    ``send_signal``, ``pid``, ``returncode``)."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return int(self._process.exitcode)

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def spawn_role(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None
) -> tuple[RoleProcess, Path]:
    """Start ``asyncrl <argv>`` forked from the preloaded server, its stdout and stderr to
    ``log_path`` and ``env`` added to its environment; it dies with this process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start_role_server()  # SIGINT ignored in the server (a no-op once it runs)
    # A process that ignores SIGINT keeps its roles so: a SIGINT to the group once stopped
    # the workers alone, and the run went on. (`asyncrl run &` from a script starts with it
    # ignored; its launcher takes it back first: stop_on_signals.)
    interrupt = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ctx = _context()
    process = ctx.Process(
        target=_role_main,
        args=(argv, str(log_path), child_env(env), os.getpid(), interrupt),
        name=argv[0] if argv else "asyncrl",
    )
    process.start()
    return RoleProcess(process), log_path
