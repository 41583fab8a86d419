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

import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


@dataclass
class Snapshot:
    """What a checkpoint holds, copied off the live objects: the tensors into host memory (a
    storage shared by several tensors, tied weights, copied once), the state as JSON. The
    trainer goes on training while a ``CheckpointWriter`` writes it."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: torch.Tensor
    state_json: str


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

    raw = {
        "step": state.step,
        "version": state.version,
        "batcher": state.batcher,
        "metrics": state.metrics,
    }
    return Snapshot(
        step=state.step,
        model=host(model.state_dict()),
        optimizer=host(optimizer.state_dict()),
        rng=torch.get_rng_state(),
        state_json=json.dumps(raw, indent=1),
    )


def save_checkpoint(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int = 3,
) -> Path:
    return write_checkpoint(run_dir, snapshot(model, optimizer, state), keep)


def write_checkpoint(run_dir: Path, snap: Snapshot, keep: int = 3) -> Path:
    import torch

    root = _ckpt_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{snap.step:06d}"
    tmp = root / f".tmp_step_{snap.step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(snap.model, tmp / "model.pt")
    torch.save(snap.optimizer, tmp / "optimizer.pt")
    torch.save({"torch": snap.rng}, tmp / "rng.pt")
    (tmp / "state.json").write_text(snap.state_json)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    latest_tmp.replace(root / "latest")
    _prune(root, keep)
    return final


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

    def submit(self, snap: Snapshot) -> None:
        self.wait()
        self._thread = threading.Thread(
            target=self._write, args=(snap,), name=f"checkpoint-{snap.step}", daemon=True
        )
        self._thread.start()

    def _write(self, snap: Snapshot) -> None:
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
            raise RuntimeError(f"writing a checkpoint failed: {err}") from err


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[: max(0, len(done) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = _ckpt_root(run_dir) / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> TrainerState:
    import torch

    model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    raw = json.loads((path / "state.json").read_text())
    return TrainerState(
        step=raw["step"], version=raw["version"], batcher=raw["batcher"], metrics=raw["metrics"]
    )
