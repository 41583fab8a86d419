"""Trainer checkpoints: model, optimizer, step, version, and the consumed offsets of ``samples``.

Written to ``run_dir/checkpoints/step_<N>/`` through a temporary directory and a rename, so a
crash mid-write leaves the previous checkpoint intact; ``latest`` names the newest complete one.
Loaded with ``weights_only=True``: these are our own files, but there is no reason to allow code.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def save_checkpoint(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int = 3,
) -> Path:
    root = _ckpt_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:06d}"
    tmp = root / f".tmp_step_{state.step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(model.state_dict(), tmp / "model.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(
        {"torch": torch.get_rng_state()},
        tmp / "rng.pt",
    )
    (tmp / "state.json").write_text(
        json.dumps(
            {
                "step": state.step,
                "version": state.version,
                "batcher": state.batcher,
                "metrics": state.metrics,
            },
            indent=1,
        )
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    latest_tmp.replace(root / "latest")
    _prune(root, keep)
    return final


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
    model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    raw = json.loads((path / "state.json").read_text())
    return TrainerState(
        step=raw["step"], version=raw["version"], batcher=raw["batcher"], metrics=raw["metrics"]
    )
