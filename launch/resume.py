"""What ``asyncrl run`` does with an earlier run in its directory: one decision, made here.

``decide(cfg)`` reads the run's directory (``config.yaml``, ``summary.json``, checkpoints, and
with the embedded broker the archived log) and changes nothing. Its outcome is one of:

- fresh: nothing to go on from; the run starts in the directory as it is.
- resume: an unfinished run (killed, crashed, its broker died) goes on from its last
  checkpoint (or its start), with the embedded broker its archived log restored first.
- set_aside (embedded broker): a finished run, a run whose log was lost (a checkpoint, no
  archive: its offsets would point nowhere), or any earlier run under
  ``trainer.resume_mode=disable`` is moved to ``<run_dir>.<time>``; a new run starts.
- finished (a Kafka cluster, which keeps the run's log): nothing to train, nothing starts.
- refused: a key the run cannot change (``resume_check``), or ``resume_mode=disable`` where
  the earlier run's log is still on the cluster.

The launcher acts on it (``launcher.resume_or_set_aside``) and ``asyncrl run --dry-run``
prints it (``preflight``): one decision in one place, so what the dry run says is what the
launcher does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.config import RunConfig

Outcome = Literal["fresh", "resume", "set_aside", "finished", "refused"]


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    line: str
    """One line for the dry run (of a refusal: the error after the key)."""
    key: str = "run_id"
    """The key the line is about (a refusal names the key refused)."""
    step: int | None = None
    """resume: the step of the checkpoint it goes on from (None: from its start)."""
    restore_log: bool = False
    """resume on the embedded broker: the archived log goes back into the new broker."""
    why: str = ""
    """set_aside: why, in a few words (the launcher's line says it in brackets)."""
    finished: bool = False
    """The earlier run had finished: its summary.json is there, read or not (the launcher's
    line of a set-aside run says how to go on from its policy)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Of a finished run: its summary.json ({} where it does not read)."""


def read_summary(cfg: RunConfig) -> dict[str, Any]:
    """The run's ``summary.json``; {} where there is none, or it does not read as a JSON
    object: a trainer killed while writing it (after its RunFinished) left it cut short, and
    ``asyncrl run`` of the finished run stopped with a JSONDecodeError traceback."""
    path = cfg.run_dir / "summary.json"
    try:
        done = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return done if isinstance(done, dict) else {}


def decide(cfg: RunConfig) -> Decision:
    """What ``asyncrl run`` with ``cfg`` does with what ``cfg.run_dir`` holds (module
    docstring). Reads the directory; changes nothing."""
    from asyncrl.consumers.checkpoint import checkpoint_step, latest_checkpoint
    from asyncrl.launch.log_archive import has_archive

    run_dir = cfg.run_dir
    finished = (run_dir / "summary.json").exists()
    summary = read_summary(cfg) if finished else {}
    ckpt = latest_checkpoint(run_dir)
    step = checkpoint_step(ckpt) if ckpt is not None else None
    disable = cfg.trainer.resume_mode == "disable"
    if cfg.kafka.bootstrap_servers is None:
        archived = has_archive(cfg)
        if archived and not finished and not disable:
            return _resume(cfg, step, restore_log=True)
        if not finished and not archived and ckpt is None:
            return _fresh(cfg)
        if finished:
            at = summary.get("step")
            why = "it had finished" + (f" at step {at}: {summary.get('reason')}" if at else "")
        elif disable:
            why = "unfinished; trainer.resume_mode=disable"
        else:
            why = "its log was lost with its broker"
        return Decision(
            "set_aside",
            f"moves the earlier run in {run_dir} aside to {run_dir.name}.<time> ({why}) and "
            "starts afresh",
            why=why,
            finished=finished,
            summary=summary,
        )
    if disable and ckpt is not None:
        instead = (
            f" (that run has finished, {finished_at(summary)}; auto trains nothing)"
            if finished
            else ", or set trainer.resume_mode=auto to resume it"
        )
        return Decision(
            "refused",
            f"disable, but {run_dir} holds checkpoints of an earlier run ({ckpt.name}) whose "
            f"log is still on {cfg.kafka.bootstrap_servers}: start afresh under another "
            f"run_id={instead}",
            key="trainer.resume_mode",
            finished=finished,
            summary=summary,
        )
    if finished:
        return Decision(
            "finished",
            f"run {cfg.run_id!r} has finished ({finished_at(summary)}): nothing to train, "
            "nothing is started; a new run needs a run_id= of its own",
            finished=True,
            summary=summary,
        )
    if not (run_dir / "config.yaml").exists():
        return _fresh(cfg)  # a log of this run on the broker is refused at set-up
    return _resume(cfg, step, restore_log=False)


def finished_at(summary: dict[str, Any]) -> str:
    """Where a finished run ended, from its summary."""
    if not summary:
        return "its summary.json does not read"
    return f"step {summary.get('step')}: {summary.get('reason')}"


def _fresh(cfg: RunConfig) -> Decision:
    return Decision(
        "fresh", f"no earlier run to go on from in {cfg.run_dir}: the run starts afresh"
    )


def _resume(cfg: RunConfig, step: int | None, restore_log: bool) -> Decision:
    """Resume, unless the new config changes a key the run cannot change."""
    from asyncrl.launch.resume_check import changed_key

    if (found := changed_key(cfg)) is not None:
        return Decision("refused", found[1], key=found[0])
    keys = (
        "no fixed key changed"
        if (cfg.run_dir / "config.yaml").exists()
        else "no config.yaml to compare its keys with"
    )
    return Decision(
        "resume",
        f"resumes the unfinished run in {cfg.run_dir} "
        + (f"from step {step}" if step is not None else "from its start (no checkpoint)")
        + (", its archived log restored" if restore_log else "")
        + f" ({keys})",
        step=step,
        restore_log=restore_log,
    )
