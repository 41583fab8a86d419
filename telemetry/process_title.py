"""A process's name as ``ps`` and ``top`` show it: which role, which rank.

``asyncrl run`` forks its roles from one preloaded server (``launch/process.py``), so without a
title every role shows the server's command line, and the ranks of a sharded trainer run the
same command. ``set_title`` writes the command line ``ps`` shows (with the ``setproctitle``
package) and the kernel's 15-character name (``ps -o comm``, ``top``); without the package,
only the latter (Linux ``prctl(PR_SET_NAME)``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15


def set_title(title: str) -> None:
    """Name this process ``title`` in ``ps`` (its first 15 characters in ``ps -o comm``)."""
    try:
        import setproctitle
    except ImportError:
        _set_comm(title)
        return
    setproctitle.setproctitle(title)  # on Linux it sets the comm name too


def _set_comm(title: str) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
