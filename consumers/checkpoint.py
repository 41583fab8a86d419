"""Trainer checkpoints: model, optimizer, step, version, and the consumed offsets of ``samples``.

Written to ``run_dir/checkpoints/step_<N>/`` through a temporary directory and a rename, so a
crash mid-write leaves the previous checkpoint intact; ``latest`` names the newest complete one.
The trainer copies what a checkpoint holds into host memory (``snapshot``) and a thread writes
it (``CheckpointWriter``) while the next steps train: a real model's checkpoint is gigabytes.
Loaded with ``weights_only=True``: these are our own files, but there is no reason to allow code.
torch is imported where tensors are written or read, not with the module: the launcher asks
``latest_checkpoint`` at start-up, and importing torch there cost ~1 s of every ``asyncrl run``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from asyncrl.consumers.exit_codes import ExitCode

if TYPE_CHECKING:
    import torch


@dataclass
class TrainerState:
    step: int
    version: int
    batcher: dict[str, Any]
    """SampleBatcher.state(): settled offsets per partition, consumed per worker, drops."""
    metrics: dict[str, Any]


def _ckpt_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is (or would be) written."""
    return _ckpt_root(run_dir) / f"step_{step:06d}"


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint directory ``checkpoint_dir`` named."""
    return int(path.name.removeprefix("step_"))


class TrainerAlreadyRunning(RuntimeError):
    """Another trainer holds this run's checkpoints (``trainer_lock``)."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, no permission); says what to free.
    Not a crash: a restarted trainer trained the same steps again and failed on the same disk
    (``trainer.max_restarts`` times, each voiding its steps), so the trainer exits with
    ``EXIT_CODE`` and the launcher does not restart it."""

    EXIT_CODE = ExitCode.CHECKPOINT_UNWRITABLE


def trainer_lock(run_dir: Path) -> IO[str]:
    """The run's one trainer: an ``flock`` on ``checkpoints/.trainer.lock``, held while the
    returned file stays open (the system lets go when the process dies, however it dies).
    A second ``asyncrl train`` of a running run (role by role, on another host sharing the
    run's directory) trained beside the first, both publishing versions: the audit failed on
    reused versions and regressions. It now stops at once, naming the first's pid."""
    root = _ckpt_root(run_dir)
    try:  # a read-only disk was a traceback here, restarted as a crash
        root.mkdir(parents=True, exist_ok=True)
        lock = (root / ".trainer.lock").open("a+")
    except OSError as err:
        raise CheckpointWriteError(
            f"cannot write the run's checkpoints in {root}: {err.strerror or err}"
        ) from err
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise TrainerAlreadyRunning(
            f"another trainer of this run is running ({holder}; it holds {root}): a run has one "
            "trainer; stop that one first to restart it (it resumes from its checkpoint)"
        ) from None
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    return lock


@dataclass
class Snapshot:
    """What a checkpoint holds, copied off the live objects: the tensors into host memory (a
    storage shared by several tensors, tied weights, copied once), the state as JSON. The
    trainer goes on training while a ``CheckpointWriter`` writes it."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: torch.Tensor
    state: dict[str, Any]
    """Step, version, batcher state and metrics, serialized by the writer's thread: the
    batcher's settled ids grew with the run then (they grow with the dataset now), and
    encoding them on the trainer's thread (with an indent: Python's slow encoder) took
    seconds per save in a long run."""


class ShardedWrite(Protocol):
    """A snapshot each rank of a sharded trainer is writing on its own
    (``consumers/fsdp_checkpoint.py``); ``finish`` waits for the shards and, on rank 0,
    publishes the checkpoint."""

    step: int

    def finish(self, run_dir: Path, keep: int) -> Path: ...


def snapshot(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState
) -> Snapshot:
    import torch

    copies: dict[tuple[Any, ...], torch.Tensor] = {}

    def host(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = (x.untyped_storage().data_ptr(), x.storage_offset(), x.shape, x.stride())
            if key not in copies:
                copies[key] = x.detach().to("cpu", copy=True)
            return copies[key]
        if isinstance(x, dict):
            return {k: host(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(host(v) for v in x)
        return x

    return Snapshot(
        step=state.step,
        model=host(model.state_dict()),
        optimizer=host(optimizer.state_dict()),
        rng=torch.get_rng_state(),
        state=state_json(state),
    )


def state_json(state: TrainerState) -> dict[str, Any]:
    """``state`` as ``state.json`` holds it, encoded later by the writer's thread."""
    return {
        "step": state.step,
        "version": state.version,
        # Copies: the trainer goes on changing its own while the writer encodes these
        # (``SampleBatcher.state`` returns fresh containers of immutable values).
        "batcher": dict(state.batcher),
        "metrics": dict(state.metrics),
    }


def save_checkpoint(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int = 3,
) -> Path:
    return write_checkpoint(run_dir, snapshot(model, optimizer, state), keep)


def write_checkpoint(run_dir: Path, snap: Snapshot | ShardedWrite, keep: int = 3) -> Path:
    import torch

    if not isinstance(snap, Snapshot):  # a sharded one: each rank wrote its shards
        return snap.finish(run_dir, keep)
    root = _ckpt_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = temporary_dir(run_dir, snap.step, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        torch.save(snap.model, tmp / "model.pt")
        torch.save(snap.optimizer, tmp / "optimizer.pt")
        torch.save({"torch": snap.rng}, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps(snap.state))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk gets its room back
        raise
    return publish_checkpoint(run_dir, tmp, snap.step, keep)


def temporary_dir(run_dir: Path, step: int, pid: int) -> Path:
    """Where the writer with process id ``pid`` writes the checkpoint of ``step`` before
    ``publish_checkpoint`` renames it (``remove_leftovers`` clears one a kill left)."""
    return _ckpt_root(run_dir) / f".tmp_step_{step:06d}_{pid}"


def publish_checkpoint(run_dir: Path, tmp: Path, step: int, keep: int) -> Path:
    """Make the complete checkpoint written in ``tmp`` the checkpoint of ``step`` (a rename)
    and ``latest``; keep the newest ``keep``."""
    root = _ckpt_root(run_dir)
    final = checkpoint_dir(run_dir, step)
    # The same step again (the run's last, written in the loop and at the end): the complete
    # one moves aside, not away, until the new one is in place (deleting it first, a kill
    # left ``latest`` naming a half-deleted directory, and the restart trained from step 0).
    old = root / f".old_step_{step:06d}_{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    latest_tmp.replace(root / "latest")
    shutil.rmtree(old, ignore_errors=True)
    _prune(root, keep)
    return final


CHECKPOINT_FILES = ("model.pt", "optimizer.pt", "rng.pt", "state.json")
SHARDED_FILES = ("shards/.metadata", "state.json")
"""A sharded checkpoint's (``consumers/fsdp_checkpoint.py``): the shards' index and the state."""


def is_sharded(path: Path) -> bool:
    """``path`` holds a sharded checkpoint (its ``shards/`` directory) rather than model.pt."""
    return (path / "shards").is_dir()


def _complete(path: Path) -> bool:
    files = SHARDED_FILES if is_sharded(path) else CHECKPOINT_FILES
    return all((path / name).is_file() for name in files)


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Directories of checkpoint writes a killed or failed trainer left (``.tmp_step_*``,
    ``.old_step_*``: named by a pid no later trainer has, so nothing else removes them; a
    full disk stayed full). Only the run's one trainer may call this (``trainer_lock``)."""
    root = _ckpt_root(run_dir)
    gone = [p for p in (*root.glob(".tmp_step_*"), *root.glob(".old_step_*")) if p.is_dir()]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


class CheckpointWriter:
    """Writes snapshots on a thread of its own, one at a time, so that the trainer's step waits
    only for the copy into host memory, not for the disk. ``submit`` first waits for the write
    before it (at most one in flight); ``wait`` for the last. A write that failed raises in the
    trainer at the next ``submit``, ``idle`` or ``wait``."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        self.run_dir, self.keep = run_dir, keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.written: Path | None = None
        """The checkpoint written last."""

    def submit(self, snap: Snapshot | ShardedWrite) -> None:
        self.wait()
        self._thread = threading.Thread(
            target=self._write, args=(snap,), name=f"checkpoint-{snap.step}", daemon=True
        )
        self._thread.start()

    def _write(self, snap: Snapshot | ShardedWrite) -> None:
        try:
            self.written = write_checkpoint(self.run_dir, snap, self.keep)
        except BaseException as err:  # raised again in the trainer's thread
            self._error = err

    def idle(self) -> bool:
        """No write in flight (and the last one did not fail)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self.wait()
        return True

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            full = isinstance(err, OSError) and err.errno == errno.ENOSPC
            full = full or "unexpected pos" in str(err)  # torch's zip writer on a full disk
            why = (
                f"the disk of {self.run_dir} is full (a write needs room for one more "
                "checkpoint than trainer.keep_checkpoints keeps)"
                if full
                else str(err)
            )
            raise CheckpointWriteError(f"writing a checkpoint failed: {why}") from err


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[: max(0, len(done) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, or, where that one is not complete (a write or a
    deletion cut short), the newest complete one."""
    root = _ckpt_root(run_dir)
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text().strip()
    if _complete(path):
        return path
    done = sorted((p for p in root.glob("step_*") if p.is_dir() and _complete(p)), reverse=True)
    return done[0] if done else None


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> TrainerState:
    import torch

    if is_sharded(path):  # written by N ranks: DCP reads it into this one process
        from asyncrl.consumers.dcp_read import read_whole

        read_whole(path, model, optimizer)
        return read_trainer_state(path)
    model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    return read_trainer_state(path)


def read_trainer_state(path: Path) -> TrainerState:
    """The trainer state (step, version, batcher, metrics) of the checkpoint at ``path``."""
    raw = json.loads((path / "state.json").read_text())
    return TrainerState(
        step=raw["step"], version=raw["version"], batcher=raw["batcher"], metrics=raw["metrics"]
    )


class TrainerCheckpoints:
    """The run's checkpoints as its one trainer holds them (step 4 of ``consumers/trainer.py``):
    the run's lock, leftovers of cut writes removed, the checkpoint to resume from, snapshots
    written on a thread, and their samples offsets committed once they are on disk (for lag
    monitoring only: the checkpoint is the source of truth)."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        import logging

        self._lock = trainer_lock(run_dir)  # the run's one trainer, from here
        for left in remove_leftovers(run_dir):
            logging.getLogger(__name__).info(
                "removed %s, left by a checkpoint write that did not finish", left.name
            )
        self.latest = latest_checkpoint(run_dir)
        """The checkpoint a start resumes from (None: a fresh run)."""
        self.writer = CheckpointWriter(run_dir, keep)
        self._uncommitted: tuple[Any, dict[tuple[str, int], int]] | None = None

    def save(
        self, snap: Snapshot | ShardedWrite, commit: Any, offsets: dict[tuple[str, int], int]
    ) -> None:
        """Write ``snap`` on the writer's thread (the one before it first on disk); once it is
        on disk, ``commit(offsets)``."""
        self.writer.wait()  # the write before (it had save_freq steps): one at a time
        self.commit_written()
        self.writer.submit(snap)
        self._uncommitted = (commit, offsets)

    def commit_written(self) -> None:
        """Commit the offsets of the last checkpoint if it is on disk."""
        if self._uncommitted is not None and self.writer.idle():
            commit, offsets = self._uncommitted
            commit(offsets)
            self._uncommitted = None

    def wait(self) -> None:
        """Until the last write is on disk, its offsets committed."""
        self.writer.wait()
        self.commit_written()

    def close(self) -> None:
        """Let go of the run's trainer lock."""
        self._lock.close()
