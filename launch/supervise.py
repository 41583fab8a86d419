"""A run's processes watched (step 4 of ``launch/launcher.py``): progress read back from the
``steps`` topic until the trainer exits; a role that dies restarted (a worker up to
``rollout.max_restarts`` times and it recovers its work from the log, the trainer up to
``trainer.max_restarts`` and it resumes from its last checkpoint) or the run failed, saying
what the processes said last; the trainer's summary printed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig
from asyncrl.consumers.exit_codes import STOPPED_BY, ExitCode
from asyncrl.launch.broker import EmbeddedBroker
from asyncrl.launch.process import preloaded_available, spawn, spawn_role
from asyncrl.launch.progress import StepProgress, counts_text
from asyncrl.launch.resume import read_summary
from asyncrl.launch.setup import LAUNCHER_LOG


class RunFailed(RuntimeError):
    pass


class RoleProcess(Protocol):
    """What the launcher uses of a role's process: a ``subprocess.Popen``, or a ``RayProcess``."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...


def trainer_not_restarted(rc: int) -> str | None:
    """Why a trainer that exited with ``rc`` is not restarted: it stopped on a condition a
    restart meets again (None: a crash, restarted up to ``trainer.max_restarts``)."""
    if rc == ExitCode.GAVE_UP:
        return "the trainer gave up (a limit the config sets, not a crash: it is not restarted)"
    if rc == ExitCode.CHECKPOINT_UNWRITABLE:
        return (
            "the trainer could not write a checkpoint (not a crash: a restart would train the "
            "same steps again and fail on the same disk, so it is not restarted)"
        )
    return None


class BrokerDied(RunFailed):
    """The embedded broker stopped under a run."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def failure_report(name: str, rc: int, log_path: Path) -> str:
    """What a process that failed the run said last, and, when it is the trainer, what the
    other processes of the run said last (a trainer that waited for samples in vain fails
    because of a worker, whose log says why)."""
    report = f"{name} exited with code {rc}; last lines of {log_path}:\n{_tail(log_path)}"
    if name != "trainer":
        return report
    skip = {log_path, log_path.parent / LAUNCHER_LOG}  # the launcher's holds spans only
    for other in sorted(log_path.parent.glob("*.log")):
        if other not in skip and (lines := _tail(other, lines=12)):
            report += f"\n--- last lines of {other}:\n{lines}"
    return report


def spawn_local(
    name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None
) -> tuple[RoleProcess, Path]:
    """A role's command (``python -m asyncrl ...``) forked from the preloaded server where
    there is one (``launch/process.py``), any other command as a fresh process; ``env``
    added to its environment."""
    if cmd[:3] == [sys.executable, "-m", "asyncrl"] and preloaded_available():
        return spawn_role(cmd[3:], log_path, env)
    return spawn(cmd, log_path, env)


def pid_of(proc: Any) -> int:
    """A local role's pid; -1 for a Ray actor's child, which runs on another node's terms."""
    return getattr(proc, "pid", -1)


def trainer_command(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "asyncrl", "train", "--config", str(config_path)]


def worker_command(config_path: Path, worker_id: int) -> list[str]:
    return [
        *[sys.executable, "-m", "asyncrl", "rollout"],
        *["--config", str(config_path), "--worker-id", str(worker_id)],
    ]


def follow(
    cfg: RunConfig,
    bootstrap: str,
    procs: dict[str, tuple[RoleProcess, Path]],
    console: Console,
    config_path: Path,
    start: Callable[[str, list[str], Path], tuple[Any, Path]] = spawn_local,
    broker: EmbeddedBroker | None = None,
) -> dict[str, Any]:
    """Show progress from the steps topic until the trainer exits with 0. A process that dies
    is restarted (a worker up to ``rollout.max_restarts`` times, the trainer up to
    ``trainer.max_restarts``); a death beyond that fails the run, and so does the death of
    the embedded broker (the run is resumed by starting it again: its log is archived)."""
    from asyncrl.kafka import Reader
    from asyncrl.schemas.step import decode_step

    restarts: dict[str, int] = {}
    left: set[str] = set()
    """Workers told to stop (exit 143 or 130): they left the run, and are not restarted."""
    trainer_log = procs["trainer"][1]
    reader = Reader(cfg.kafka, bootstrap, decode_step, background=True)
    reader.assign(cfg.topic("steps"))
    # Steps already on the log (a resumed run's earlier launches) move the bar silently.
    earlier = {p: high for p, (_low, high) in reader.watermarks(cfg.topic("steps")).items()}
    try:
        with StepProgress(cfg, console) as progress:
            while True:
                for rec in reader.poll(0.05):
                    if rec.offset < earlier.get(rec.partition, 0):
                        progress.update(rec.value, earlier=True)
                        if rec.offset == earlier[rec.partition] - 1:
                            progress.resumed()
                    else:
                        progress.update(rec.value)
                if broker is not None and not broker.running:
                    raise BrokerDied(
                        f"the embedded broker (pid {broker.pid}) died; the run's log is archived "
                        f"in {cfg.run_dir / 'log'}: run the same command again to resume the run"
                    )
                for name, (proc, log_path) in procs.items():
                    # A worker exits 0 only after the trainer's RunFinished, which the trainer
                    # publishes before it writes its summary and exits: not a failure.
                    rc = proc.poll()
                    if rc in (None, 0) or name in left:
                        continue
                    is_trainer = name == "trainer"
                    if not is_trainer and rc in STOPPED_BY:  # `kill PID`: scaled down
                        left.add(name)
                        _say_left(name, rc, procs, cfg, config_path, console)
                        continue
                    if is_trainer and _workers_left(procs) == [] and left:
                        raise RunFailed(
                            "no rollout worker is left to generate (stopped: "
                            f"{', '.join(sorted(left))}), so the trainer was not restarted; "
                            + failure_report(name, rc, log_path)
                        )
                    if is_trainer and (why := trainer_not_restarted(rc)) is not None:
                        raise RunFailed(f"{why}; " + failure_report(name, rc, log_path))
                    max_restarts = (
                        cfg.trainer.max_restarts
                        if is_trainer
                        else cfg.actor_rollout_ref.rollout.max_restarts
                    )
                    if restarts.get(name, 0) < max_restarts:
                        restarts[name] = restarts.get(name, 0) + 1
                        cmd = (
                            trainer_command(config_path)
                            if is_trainer
                            else worker_command(config_path, int(name.removeprefix("rollout-")))
                        )
                        procs[name] = start(name, cmd, log_path)
                        pid = pid_of(procs[name][0])
                        note = getattr(proc, "exit_note", None)  # which rank (rank_group.py)
                        console.log(
                            f"[yellow]{name} exited with code {rc}"
                            + (f" ({note})" if note else "")
                            + "; restarting it "
                            f"({restarts[name]}/{max_restarts}"
                            + (f", pid {pid}" if pid > 0 else "")
                            + "); "
                            + (
                                "it resumes from its last checkpoint"
                                if is_trainer
                                else "it recovers its work from the log"
                            )
                        )
                        break
                    raise RunFailed(failure_report(name, rc, log_path))
                if procs["trainer"][0].poll() == 0:
                    break
            # The steps the trainer recorded before it exited, up to its last (the summary
            # names it), instead of a fixed wait: it only wrote the summary once they were on
            # the log.
            summary = read_summary(cfg)
            deadline = time.monotonic() + 2.0
            while progress.last_step < summary.get("step", 0) and time.monotonic() < deadline:
                for rec in reader.poll(0.05):
                    progress.update(rec.value)
    finally:
        reader.close()
    if summary and restarts:
        # The trainer's summary counts from its last start; what it does not know is here.
        summary["restarts"] = dict(restarts)
    resumed = any(earlier.values()) or bool(restarts.get("trainer"))
    print_summary(summary, console, trainer_log, resumed=resumed)
    return summary


def _workers_left(procs: dict[str, tuple[RoleProcess, Path]]) -> list[str]:
    return [n for n, (p, _) in procs.items() if n != "trainer" and p.poll() is None]


def _say_left(
    name: str,
    rc: int,
    procs: dict[str, tuple[RoleProcess, Path]],
    cfg: RunConfig,
    config_path: Path,
    console: Console,
) -> None:
    """A worker stopped by a signal left the run as docs/cluster.md says; with none left,
    the trainer can only wait for one started by hand."""
    said = f"[yellow]{name} was stopped ({STOPPED_BY[rc]}) and left the run; not restarted"
    remaining = _workers_left(procs)
    if remaining:
        console.log(f"{said}; {len(remaining)} rollout worker(s) go on")
        return
    console.log(
        f"{said}. No rollout worker is left: the trainer waits up to sync.timeout_s="
        f"{cfg.sync.timeout_s:g} s for one started by hand (`asyncrl rollout --config "
        f"{config_path} --worker-id {name.removeprefix('rollout-')}`), then the run fails[/]"
    )


def wait_workers(procs: dict[str, tuple[RoleProcess, Path]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for name, (proc, _) in procs.items():
        if name == "trainer":
            continue
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()


def print_summary(
    summary: dict[str, Any], console: Console, trainer_log: Path, resumed: bool = False
) -> None:
    """The trainer's summary; of a resumed run or a restarted trainer, its times and counts
    are from the trainer's last start (``asyncrl report`` joins the launches)."""
    if not summary:
        console.print(f"[yellow]no summary written; see {trainer_log}[/]")
        return
    title = "run summary" + (
        " (since the trainer's last start: `asyncrl report` counts the whole run)"
        if resumed
        else ""
    )
    table = Table(title=title, show_header=False)
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:.3f}"
        elif value is None:  # a figure the run had nothing for (no sync: no resume time)
            value = "-"
        elif isinstance(value, dict):
            value = counts_text(value)
        table.add_row(str(key), str(value))
    console.print(table)
