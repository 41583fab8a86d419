"""The exit codes of asyncrl's processes: what ``asyncrl <command>`` returns, and what the
launcher reads from a role that ended (docs/faults.md lists the cases)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    """Done: the command did what it was asked (a role: its run finished)."""
    FAILED = 1
    """It failed; the one-line message on stderr says why."""
    USAGE = 2
    """A bad command line or config, or an environment it cannot use, as argparse's own."""
    GAVE_UP = 3
    """The trainer stopped at a limit the config sets (``max_num_gen_batches``): not a crash,
    so the launcher does not restart it."""
    CHECKPOINT_UNWRITABLE = 4
    """The trainer could not write a checkpoint (a full disk): a restart would fail the same."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""
    BROKEN_PIPE = 141
    """Its reader closed the pipe (``asyncrl inspect ... | head``; 128 + SIGPIPE)."""
    TERMINATED = 143
    """Stopped by SIGTERM (128 + SIGTERM): ``kill``, ``docker compose stop``, a supervisor."""


STOPPED_BY: dict[int, str] = {ExitCode.TERMINATED: "SIGTERM", ExitCode.INTERRUPTED: "Ctrl-C"}
"""The codes of a process a signal stopped with its run still open, and the signal's name."""


def stopped_by(how: str) -> ExitCode:
    """The exit code of a process stopped by ``how``: ``"Ctrl-C"``, else SIGTERM's."""
    return ExitCode.INTERRUPTED if how == "Ctrl-C" else ExitCode.TERMINATED
