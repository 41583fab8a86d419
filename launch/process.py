"""Child processes that cannot outlive the process that started them.

Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` is set in the child between fork and exec, so a
broker or a worker is killed by the kernel when its parent dies, even by SIGKILL, where no
Python cleanup runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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


def child_env() -> dict[str, str]:
    """The environment for our children: never reach for a model hub."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def spawn(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen, Path]:
    """Start ``cmd`` with stdout and stderr to ``log_path``; it dies with this process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            preexec_fn=die_with_parent(),
            close_fds=True,
        )
    return proc, log_path
