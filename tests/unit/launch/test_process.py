"""Roles forked from the preloaded server (launch/process.py): real processes, as
``python -m asyncrl <argv>`` would be, that still end with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from asyncrl.launch.process import preloaded_available, spawn_role

pytestmark = pytest.mark.skipif(not preloaded_available(), reason="needs Linux's forkserver")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_forked_role_writes_its_log_and_reports_its_exit_code(tmp_path):
    ok, log = spawn_role(["--help"], tmp_path / "help.log")
    assert ok.wait(120) == 0 and ok.returncode == 0
    assert "usage: asyncrl" in log.read_text()
    bad, log = spawn_role(["no-such-command"], tmp_path / "bad.log")
    assert bad.wait(60) == 2  # argparse's usage error, as from the command line
    assert "invalid choice: 'no-such-command'" in log.read_text()


def test_a_forked_role_shows_its_own_command_in_ps(tmp_path):
    """Not the fork server's command line: every role showed as that one, and so did the
    trainer's ranks (the title was written after the environment was replaced, and
    setproctitle found no room then)."""
    role, log = spawn_role(["broker"], tmp_path / "broker.log")
    try:
        _wait_until_serving(role.pid, log)
        with open(f"/proc/{role.pid}/cmdline", "rb") as f:
            assert f.read().startswith(b"asyncrl broker\0")
    finally:
        role.kill()
        role.wait(30)


def _wait_until_serving(role: int, log) -> None:
    """Until the broker role logs its address (up to 2 min), failing if it dies first."""
    deadline = time.monotonic() + 120
    while not (log.exists() and "127.0.0.1" in log.read_text()):
        assert time.monotonic() < deadline and _alive(role), "the role never started"
        time.sleep(0.1)


def _launcher_of_a_broker_role(log, first: str = "", **popen: Any) -> subprocess.Popen:
    """A process that runs ``first``, forks a broker role (its output to ``log``), prints the
    role's pid and sleeps (a Ctrl-C: prints "stopped", exits 130): a launcher, for what
    happens to its role."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from pathlib import Path\n"
            "from asyncrl.launch.process import spawn_role\n"
            f"{first}\n"
            f"proc, _ = spawn_role(['broker'], Path({str(log)!r}))\n"
            "print(proc.pid, flush=True)\n"
            "try:\n"
            "    time.sleep(600)\n"
            "except KeyboardInterrupt:\n"
            "    print('stopped', flush=True)\n"
            "    raise SystemExit(130)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        **popen,
    )


def test_a_forked_role_ends_with_the_launcher_even_when_it_is_sigkilled(tmp_path):
    """multiprocessing hands each child a copy of the server's "alive" pipe, so the server
    (and, through PDEATHSIG, the child) would outlive a killed launcher; a role closes its
    copy, and a thread of its own kills it the moment the launcher is gone."""
    log = tmp_path / "broker.log"
    launcher = _launcher_of_a_broker_role(log)
    pid = -1
    try:
        assert launcher.stdout is not None
        pid = int(launcher.stdout.readline())
        _wait_until_serving(pid, log)
        launcher.kill()
        launcher.wait(10)
        killed = time.monotonic()
        while _alive(pid) and time.monotonic() < killed + 15:
            time.sleep(0.02)
        assert not _alive(pid), "the role outlived the process that started it"
        # At once: not after the server's interpreter has shut down (~1.5 s), while the role
        # went on consuming and publishing for a run that was gone.
        assert time.monotonic() - killed < 1.0
    finally:
        launcher.kill()
        if pid > 0 and _alive(pid):
            os.kill(pid, 9)


def test_the_role_server_ends_with_the_process_that_started_it():
    """Not ~0.8 s later, after its own interpreter shutdown: meanwhile it held the launcher's
    stdout and stderr, and ``asyncrl run | tee`` (or a test reading its output) waited."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from multiprocessing import forkserver\n"
            "from asyncrl.launch.process import start_role_server\n"
            "start_role_server()\n"
            "print(forkserver._forkserver._forkserver_pid, flush=True)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    server = int(launcher.stdout.readline())
    assert launcher.wait(120) == 0  # the process, not its output: the server holds that too
    assert not _alive(server), "the fork server outlived the process that started it"


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        ignored = next(line for line in f if line.startswith("SigIgn:")).split()[1]
    return bool(int(ignored, 16) & (1 << (2 - 1)))  # SIGINT is signal 2


def test_ctrl_c_while_the_role_server_imports_is_ignored_there_not_in_its_roles(tmp_path):
    """Ctrl-C in the first seconds of ``asyncrl run`` reached the fork server in the middle
    of its preloaded imports and printed a page of KeyboardInterrupt traceback (multiprocessing
    ignores SIGINT in the server only once they are done). The server now starts with it
    ignored; the roles it forks take it back (a worker's Ctrl-C hands back its work)."""
    log = tmp_path / "broker.log"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, time\n"
            "from multiprocessing import forkserver\n"
            "from pathlib import Path\n"
            "from asyncrl.launch.process import spawn_role, start_role_server\n"
            "start_role_server()\n"
            "server = forkserver._forkserver._forkserver_pid\n"
            "os.kill(server, signal.SIGINT)  # while it imports torch and transformers\n"
            "print(server, flush=True)\n"
            f"proc, _ = spawn_role(['broker'], Path({str(log)!r}))\n"
            "print(proc.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        server = int(launcher.stdout.readline())
        role = int(launcher.stdout.readline())  # the server lived on to fork it
        assert _ignores_sigint(server)
        _wait_until_serving(role, log)
        assert not _ignores_sigint(role)
    finally:
        launcher.kill()
        _, err = launcher.communicate(timeout=60)
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err


def test_a_launcher_that_ignores_sigint_starts_roles_that_ignore_it(tmp_path):
    """``asyncrl run &`` from a script starts with SIGINT ignored (so does a nohup'd run),
    as a role exec'd from it would be; a forked role took it back, and a SIGINT to the group
    stopped the workers while the launcher and the trainer went on."""
    log = tmp_path / "broker.log"
    launcher = _launcher_of_a_broker_role(
        log, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
    )
    try:
        assert launcher.stdout is not None
        role = int(launcher.stdout.readline())
        _wait_until_serving(role, log)
        assert _ignores_sigint(launcher.pid) and _ignores_sigint(role)
    finally:
        launcher.kill()
        launcher.wait(60)


def test_asyncrl_run_started_with_sigint_ignored_takes_it_back_for_itself_and_its_roles(tmp_path):
    """``asyncrl run &`` from a script (bash ignores SIGINT in a non-interactive shell's
    background jobs): the launcher kept it ignored, and ``kill -INT PID`` did nothing. Now
    the launcher's signal set-up (``stop_on_signals``, as ``asyncrl run`` calls it) takes it
    back, its roles with it, and a SIGINT stops the launcher as Ctrl-C does."""
    log = tmp_path / "broker.log"
    launcher = _launcher_of_a_broker_role(
        log,
        first="from asyncrl.launch.launcher import stop_on_signals\nstop_on_signals()",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert launcher.stdout is not None
        role = int(launcher.stdout.readline())
        _wait_until_serving(role, log)
        assert not _ignores_sigint(launcher.pid) and not _ignores_sigint(role)
        os.kill(launcher.pid, signal.SIGINT)
        assert launcher.wait(60) == 130
        assert launcher.stdout.read().strip() == "stopped"
    finally:
        launcher.kill()
        launcher.wait(60)
