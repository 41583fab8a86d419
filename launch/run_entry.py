"""``asyncrl run`` as a process: the launcher with its signals and exit code.

SIGTERM and Ctrl-C stop the run in order (``launcher.stop_on_signals``): the trainer ends its
step and checkpoints it, the workers hand back their work; the launcher then exits 143
(SIGTERM) or 130 (Ctrl-C), and the same command resumes the run.
"""

from __future__ import annotations

from asyncrl.config import RunConfig
from asyncrl.consumers.exit_codes import ExitCode


def run_until_stopped(cfg: RunConfig) -> ExitCode:
    """Run ``cfg``'s run to its end or until a signal stops it; the process's exit code."""
    from asyncrl.launch.launcher import Terminated, run, stop_on_signals

    stop_on_signals()
    try:
        summary = run(cfg)
    except KeyboardInterrupt as stopped:
        return ExitCode.TERMINATED if isinstance(stopped, Terminated) else ExitCode.INTERRUPTED
    return ExitCode.OK if summary else ExitCode.FAILED
