"""``asyncrl run``'s trainer as N ranks: started together, watched and restarted as one process.

With ``trainer.nnodes x trainer.n_gpus_per_node`` = N > 1 (on this machine:
``launch/preflight_ranks.py``) the launcher starts N ``asyncrl train`` processes with
torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR (this machine's loopback) and
MASTER_PORT (a free port, picked again at each start of the group). Rank 0's output goes to
``logs/trainer.log``, rank r's to ``logs/trainer-rank-r.log``; the ranks name themselves in
``ps`` (``asyncrl train rank 1/2 (<run_id>)``). ``TrainerGroup`` is the one ``trainer``
process ``launch/supervise.py`` watches:

* the group has ended when rank 0 has, with rank 0's exit code: the others exit on its stop
  (one left after ``STOP_GRACE_S`` is killed);
* when another rank dies first, the group is over: the others are killed at once (a rank
  waiting in a collective would wait out ``actor_rollout_ref.nccl_timeout``, and rank 0 holds
  the run's trainer lock until it is gone), and the group's exit code is the dead rank's.
  The supervisor then restarts the whole group (``trainer.max_restarts``), which resumes from
  the last checkpoint, as torchrun's elastic agent restarts all of its workers.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STOP_GRACE_S = 10.0
"""How long the other ranks get to exit once rank 0 has ended."""

REAP_S = 10.0
"""How long a killed rank is waited for (so the next group finds its lock and port free)."""

Start = Callable[..., tuple[Any, Path]]
"""The launcher's start of a role: (name, command, log path, env=...) -> (process, log path)."""


def rank_name(rank: int) -> str:
    """The launcher's name of a rank (rank 0 is the trainer)."""
    return "trainer" if rank == 0 else f"trainer-rank-{rank}"


def rank_log(log_path: Path, rank: int) -> Path:
    """Rank ``rank``'s log beside the trainer's ``log_path``."""
    return log_path if rank == 0 else log_path.with_name(f"{rank_name(rank)}{log_path.suffix}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ranks_starter(start: Start, ranks: int) -> Start:
    """``start``, with the trainer started as ``ranks`` processes in one ``TrainerGroup``
    (each rank through ``start``, so each is announced and logged under its own name)."""

    def started(name: str, cmd: list[str], log_path: Path) -> tuple[Any, Path]:
        if name != "trainer":
            return start(name, cmd, log_path)
        port = free_port()
        group: list[tuple[str, Any, Path]] = []
        try:
            for rank in range(ranks):
                env = {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(ranks),
                    "LOCAL_WORLD_SIZE": str(ranks),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
                proc, path = start(rank_name(rank), cmd, rank_log(log_path, rank), env=env)
                group.append((rank_name(rank), proc, path))
        except BaseException:
            for _, proc, _ in group:
                proc.kill()
            raise
        return TrainerGroup(group), log_path

    return started


class TrainerGroup:
    """The trainer's ranks as one of the launcher's processes (``RoleProcess``)."""

    def __init__(self, ranks: list[tuple[str, Any, Path]]):
        self.ranks = ranks
        self.pid: int = getattr(ranks[0][1], "pid", -1)
        self.returncode: int | None = None
        self.exit_note: str | None = None
        """Which rank ended the group, and how (None: rank 0 ended it)."""

    @property
    def pids(self) -> dict[str, int]:
        return {name: getattr(proc, "pid", -1) for name, proc, _ in self.ranks}

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        codes = [proc.poll() for _, proc, _ in self.ranks]
        dead = [(i, rc) for i, rc in enumerate(codes) if rc not in (None, 0)]
        if codes[0] == 0:  # the trainer ended: the others exit on its stop
            self._end(grace=STOP_GRACE_S)
            self.returncode = 0
        elif dead:
            # A death by a signal first: the cause, not a rank that then failed in a collective.
            i, rc = min(dead, key=lambda d: (d[1] >= 0, d[0]))
            self._end(grace=0.0)
            if i > 0:
                name, proc, path = self.ranks[i]
                how = f"killed by {_signal_name(-rc)}" if rc < 0 else f"exited with code {rc}"
                self.exit_note = (
                    f"{name}, pid {getattr(proc, 'pid', -1)}, {how}; the other ranks were "
                    f"stopped with it; its log: {path}"
                )
            self.returncode = rc
        return self.returncode

    def _end(self, grace: float) -> None:
        """The ranks still running: given ``grace`` seconds to exit, then killed and reaped."""
        deadline = time.monotonic() + grace
        for _, proc, _ in self.ranks:
            if proc.poll() is None and grace > 0:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
        for _, proc, _ in self.ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=REAP_S)

    def wait(self, timeout: float | None = None) -> int:
        """Until rank 0 has ended (``subprocess.TimeoutExpired`` past ``timeout``), the
        others with it; the group's exit code."""
        self.ranks[0][1].wait(timeout=timeout)
        rc = self.poll()
        assert rc is not None
        return rc

    def send_signal(self, sig: int) -> None:
        """To rank 0, which stops the group (the others wait for its stop)."""
        self.ranks[0][1].send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        for _, proc, _ in self.ranks:
            proc.kill()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
