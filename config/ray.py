"""The ``ray`` section: placement on a Ray cluster."""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import Strict


class RayConfig(Strict):
    """Placement on a Ray cluster (launcher=ray, docs/cluster.md)."""

    address: str | None = None
    """Ray cluster to join (e.g. ray://head:10001 or auto); unset: RAY_ADDRESS, else a local Ray."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of a local Ray started by the launcher (unset: the machine's)."""
    trainer_num_cpus: float = Field(1, ge=0)
    """CPUs the trainer's actor reserves."""
    trainer_num_gpus: float = Field(0, ge=0)
    """GPUs the trainer's actor reserves (its process sees them as CUDA_VISIBLE_DEVICES)."""
    rollout_num_cpus: float = Field(1, ge=0)
    """CPUs each rollout worker's actor reserves."""
    rollout_num_gpus: float = Field(0, ge=0)
    """GPUs each rollout worker's actor reserves."""
