"""``asyncrl run``: a whole run as local processes that talk only through Kafka.

1. Broker: the configured cluster, or an embedded Tansu on a free loopback port.
2. The set-up (``launch/setup.py``'s ``prepare``): the prompts read, the run's topics, the
   policy built and warm-started once (cached), the prompts topic fed, the resolved config.
3. One trainer (``trainer.nnodes x trainer.n_gpus_per_node`` ranks of it:
   ``launch/rank_group.py``) and ``rollout.num_workers`` worker processes, each
   ``python -m asyncrl ...`` with the resolved config; they die with the launcher
   (PDEATHSIG), also on a crash.
4. Progress read back from the ``steps`` topic until the trainer exits; a rollout worker that
   dies is restarted (``rollout.max_restarts``) and recovers its work from the log; a trainer
   that dies is restarted (``trainer.max_restarts``) and resumes from its last checkpoint,
   the workers joining it (``launch/supervise.py``). Then the workers stop on RunFinished,
   and the broker is stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from asyncrl.config import EMBEDDED_SESSION_TIMEOUT_MS, ConfigError, RunConfig
from asyncrl.launch.broker import ensure_broker
from asyncrl.launch.log_archive import ArchiveError, run_ref
from asyncrl.launch.preflight import check_startable, idle_workers_note
from asyncrl.launch.process import start_role_server
from asyncrl.launch.progress import records_shown, wide_console
from asyncrl.launch.rank_group import ranks_starter
from asyncrl.launch.resume import Decision, decide, finished_at
from asyncrl.launch.setup import prepare
from asyncrl.launch.supervise import (
    RoleProcess,
    RunFailed,
    follow,
    pid_of,
    spawn_local,
    trainer_command,
    wait_workers,
    worker_command,
)


class Terminated(KeyboardInterrupt):
    """SIGTERM to the launcher (``kill PID``, a supervisor), raised where it stands as a
    Ctrl-C is, for the same orderly stop (``stop_on_signals``)."""


def stop_on_signals() -> None:
    """Make SIGTERM and SIGINT stop ``run`` as Ctrl-C does: in order, the trainer's last step
    checkpointed. SIGINT is taken back where the launcher started with it ignored (bash
    ignores it in a script's background jobs, ``asyncrl run &``); the roles it starts take it
    too (``spawn_role`` passes on what the launcher does)."""

    def terminated(*_: object) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, terminated)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


STOP_GRACE_S = 120.0
"""How long a stopped run waits for its trainer to end its step and checkpoint it."""


def _stop_roles(
    cfg: RunConfig, procs: dict[str, tuple[RoleProcess, Path]], console: Console
) -> None:
    """Stop the roles as their own SIGTERM asks: the trainer between two steps, with a
    checkpoint of the last one (the next launch trains no step twice), the workers handing
    back what they hold. A second Ctrl-C (or SIGTERM) during the wait kills them at once (the
    caller's ``finally``)."""
    from asyncrl.consumers.checkpoint import checkpoint_step, latest_checkpoint

    alive = {name: proc for name, (proc, _) in procs.items() if proc.poll() is None}
    if alive:
        console.log(
            "[yellow]stopping: the trainer ends its step and checkpoints it, the workers hand "
            "back their work (Ctrl-C again stops at once)"
        )
    for proc in alive.values():
        proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for name, proc in alive.items():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            console.log(f"[red]{name} did not stop within {STOP_GRACE_S:g} s: killed")
            proc.kill()
    latest = latest_checkpoint(cfg.run_dir)
    where = f"from step {checkpoint_step(latest)}" if latest else "from its start"
    console.log(f"stopped: run the same command again to resume the run {where}")


def resume_or_set_aside(cfg: RunConfig, console: Console, decision: Decision | None = None) -> bool:
    """Act on what ``launch/resume.py`` decided of an earlier run in the run's directory
    (``decide(cfg)`` where ``decision`` is None): raise ConfigError on a refusal, before
    anything is touched; move a set-aside run to ``<run_dir>.<time>``; say so of a resume.
    Returns True when the run's archived log is to be restored into the embedded broker."""
    decision = decision or decide(cfg)
    run_dir = cfg.run_dir
    if decision.outcome == "refused":
        raise ConfigError(f"{decision.key}: {decision.line}")
    if decision.outcome == "resume" and decision.restore_log:
        console.log(f"{run_dir} holds an unfinished run: restoring its log and resuming it")
    if decision.outcome != "set_aside":
        return decision.restore_log
    archived = run_dir.with_name(f"{run_dir.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(archived)
    console.log(
        f"moved the earlier run in {run_dir} to {archived} ({decision.why}) and starting afresh"
        + (
            f" from the first policy (a finished run is not trained further; to go on from "
            f"its policy: `asyncrl export-model {archived} --out DIR`, then "
            "actor_rollout_ref.model.path=DIR)"
            if decision.finished
            else ""
        )
    )
    return False


def for_embedded_broker(cfg: RunConfig) -> RunConfig:
    """The settings that are unset and that Tansu wants other than a Kafka cluster: a short
    group session (Tansu answers a join after about half of it; each worker's first prompt
    waited ~3 s at Kafka's minimum of 6 s, ~1 s now)."""
    if cfg.kafka.session_timeout_ms is not None:
        return cfg
    cfg = cfg.model_copy(deep=True)
    cfg.kafka.session_timeout_ms = EMBEDDED_SESSION_TIMEOUT_MS
    return cfg


def run(
    cfg: RunConfig,
    console: Console | None = None,
    on_spawn: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """``on_spawn(name, pid)`` is told of every process started (restarts included): how
    fault tests, or an operator's tooling, find the trainer and workers."""
    check_startable(cfg, "run")  # a bad value fails now, naming its key (launch/preflight.py)
    with run_lock(cfg):  # before the run's directory is looked at, let alone moved aside
        # `asyncrl run | tee run.log`: lines whole
        return _launch(cfg, console or wide_console(), on_spawn)


LOCK_NAME = ".{run_id}.lock"
"""The launcher's lock file of a run, in ``output_dir`` (``run_lock``)."""


@contextlib.contextmanager
def run_lock(cfg: RunConfig) -> Iterator[None]:
    """One launcher per run, so no second one takes the run's directory for an unfinished run
    and writes into its checkpoints and archive. The lock is an ``flock`` on
    ``output_dir/.<run_id>.lock``, outside the run's directory (which a new run may move
    aside); the system lets go of it when its holder dies, however it dies, so a killed run is
    resumed at once."""
    path = Path(cfg.output_dir) / LOCK_NAME.format(run_id=cfg.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise RunFailed(
                f"run {cfg.run_id!r} is already running in {cfg.run_dir} (its `asyncrl run` is "
                f"pid {holder}): wait for it or stop it, or start this one under another "
                "run_id=... (a second launcher would write into the same log and checkpoints)"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _launch(
    cfg: RunConfig, console: Console, on_spawn: Callable[[str, int], None] | None
) -> dict[str, Any]:
    embedded = cfg.kafka.bootstrap_servers is None
    if embedded:
        cfg = for_embedded_broker(cfg)
    decision = decide(cfg)  # what the dry run said of the earlier run (launch/resume.py)
    if decision.outcome == "finished":
        _say_finished(cfg, decision.summary, console)
        return decision.summary
    # Before anything starts: a resume that changes a key the run cannot change is refused.
    resume = resume_or_set_aside(cfg, console, decision)
    if cfg.launcher == "local":
        start_role_server()  # its imports overlap the set-up below
    run_dir = cfg.run_dir
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bootstrap, broker = ensure_broker(cfg.kafka)
    procs: dict[str, tuple[RoleProcess, Path]] = {}
    ray_launcher = None
    archiver = None
    try:
        where = "embedded Tansu" if broker is not None else "external Kafka"
        console.log(f"broker: {where} at {bootstrap}")
        if resume:  # before the set-up, which then finds the prompts already fed
            _restore_log(cfg, bootstrap, console)
        if on_spawn is not None and broker is not None and broker.pid is not None:
            on_spawn("broker", broker.pid)
        resolved, config_path = prepare(cfg, bootstrap, console)
        if embedded:  # from where the archive ends: what the set-up wrote is archived too
            from asyncrl.launch.log_archive import Archiver

            archiver = Archiver(cfg, bootstrap).start()
        at = resolved.async_training
        console.log(
            f"mode ({at.mode}): staleness_threshold={at.staleness_threshold} "
            f"trigger_parameter_sync_step={at.trigger_parameter_sync_step} "
            f"require_batches={at.require_batches} partial_rollout={at.partial_rollout}"
            f"{' in_flight_update=True' if at.in_flight_update else ''}; "
            f"{resolved.actor_rollout_ref.rollout.num_workers} rollout worker(s)"
        )
        if (idle := idle_workers_note(resolved)) is not None:
            console.log(f"[yellow]{idle}[/]")
        if resolved.actor_rollout_ref.rollout.num_workers == 0:
            console.log(
                "[yellow]rollout.num_workers=0: no worker is started here; the trainer waits "
                f"for workers started elsewhere (`asyncrl rollout --config {config_path} "
                "--worker-id 0`, docs/cluster.md)[/]"
            )
        start: Callable[..., tuple[RoleProcess, Path]]
        if resolved.launcher == "ray":
            from asyncrl.launch.ray_launcher import RayLauncher

            ray_launcher = RayLauncher(resolved)
            start = ray_launcher.spawn
            console.log(f"launcher: Ray actors; {ray_launcher.describe()}")
        else:
            start = spawn_local
        if on_spawn is not None:
            start = _announcing(start, on_spawn)
        if resolved.trainer.ranks > 1:  # one machine, local (launch/preflight_ranks.py)
            start = ranks_starter(start, resolved.trainer.ranks)
            console.log(f"trainer: {resolved.trainer.ranks} ranks (FSDP2)")
        procs["trainer"] = start("trainer", trainer_command(config_path), logs / "trainer.log")
        for i in range(resolved.actor_rollout_ref.rollout.num_workers):
            name = f"rollout-{i}"
            procs[name] = start(name, worker_command(config_path, i), logs / f"{name}.log")
        pids = [
            f"{name} pid {pid}"
            for role, (proc, _) in procs.items()
            for name, pid in getattr(proc, "pids", {role: pid_of(proc)}).items()
            if pid > 0
        ]
        if pids:  # forked roles all show as the fork server's command line in ps: which is which
            console.log(f"{', '.join(pids)}; their logs: {logs}/")
        summary = follow(resolved, bootstrap, procs, console, config_path, start, broker)
        wait_workers(procs, timeout_s=30)
        return summary
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (`Terminated`): stop in order, then go
        _stop_roles(cfg, procs, console)
        raise
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
        if ray_launcher is not None:
            ray_launcher.close()
        if archiver is not None:
            # Drained to the broker's end before the broker goes (a dead broker: as it is).
            try:
                archiver.stop(drain=broker is not None and broker.running)
                total, added = archiver.total, archiver.archived
                counts = f"{total} records" + (f", {added} of them new" if added < total else "")
                ref = run_ref(cfg)
                console.log(
                    f"log archived: {archiver.directory} ({counts}); `asyncrl inspect "
                    f"samples {ref}` or `asyncrl audit {ref}` reads it with no broker running"
                )
            except ArchiveError as err:  # do not hide why the run ended
                console.log(f"[red]{err}")
        if broker is not None:
            broker.stop()


def _restore_log(cfg: RunConfig, bootstrap: str, console: Console) -> None:
    """An unfinished run's archived log, back into the new embedded broker."""
    from asyncrl.launch.log_archive import log_dir, restore

    t0 = time.monotonic()
    with records_shown(console, f"restoring {log_dir(cfg)}", "resume"):
        n = restore(cfg, bootstrap)
    console.log(f"restored {n} records of {log_dir(cfg)} in {time.monotonic() - t0:.1f} s")


def _announcing(
    start: Callable[..., tuple[Any, Path]],
    on_spawn: Callable[[str, int], None],
) -> Callable[..., tuple[Any, Path]]:
    def started(name: str, cmd: list[str], log_path: Path, **kwargs: Any) -> tuple[Any, Path]:
        proc, path = start(name, cmd, log_path, **kwargs)
        on_spawn(name, pid_of(proc))
        return proc, path

    return started


def _say_finished(cfg: RunConfig, summary: dict[str, Any], console: Console) -> None:
    """A finished run launched again: say so, and how to go on from its policy, starting
    nothing."""
    acc = summary.get("val/accuracy")
    console.log(
        f"run {cfg.run_id!r} has finished ({finished_at(summary)}"
        + (f", held-out accuracy {acc:.3f}" if isinstance(acc, int | float) else "")
        + f"; {cfg.run_dir / 'summary.json'}): nothing to train. Its policy: `asyncrl "
        f"export-model {cfg.run_id} --out DIR`; a new run needs a run_id= of its own (this "
        "run's log stays on the broker)"
    )
