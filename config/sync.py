"""The ``sync`` section: how the weights move from the trainer to the rollout workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from asyncrl.config.base import MAX_WAIT_S, Strict


class SyncConfig(Strict):
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend for the weight broadcast. auto: gloo, since the rollout
    workers generate on CPU (a trainer on a GPU packs its weights into CPU buckets); nccl only
    when set, and every end must then be on a GPU."""
    bucket_size_mb: float = Field(64.0, gt=0)
    """Tensors are packed into buckets of this size before each broadcast (at least a byte)."""

    @field_validator("bucket_size_mb")
    @classmethod
    def _at_least_a_byte(cls, mb: float) -> float:
        if int(mb * 1024 * 1024) < 1:
            raise ValueError(f"{mb:g} MB is less than one byte (a bucket of 0 bytes)")
        return mb

    master_addr: str = "127.0.0.1"
    """Address of the trainer, which hosts the weight collective's rendezvous store."""
    master_port: int | None = Field(None, ge=1, le=65535)
    """Port of that store (workers join through it); unset: the launcher picks a free one."""
    timeout_s: float = Field(300.0, gt=0, le=MAX_WAIT_S)
    """How long the trainer waits for every worker to pause before failing the sync (at most
    a week: torch's rendezvous refused more, after the warm start and the feed, blaming the
    port)."""
    verify_checksum: bool = True
    """Workers hash the received weights and compare with the trainer's hash (bit-for-bit check)."""
    shared_memory: bool = True
    """A rollout worker on the trainer's host (same host name and boot id) reads the weights
    from the trainer's memory instead of receiving them over the collective. From the second
    sync on it copies the trainer's tensors in place (one copy, one token and one
    acknowledgement a sync; on a GPU by CUDA IPC, on a CPU the trainer's tensors move once into
    shared memory); where they cannot be read in place, from two shared slots the trainer packs
    each bucket into (asyncrl bench sync: the "in place" and "shared memory" rows). gloo pairs
    only; a worker that cannot map the memory (another PID namespace, not Linux) falls back to
    the collective. False: always the collective."""

    @property
    def bucket_bytes(self) -> int:
        """``bucket_size_mb`` in bytes, as both ends plan their buckets."""
        return int(self.bucket_size_mb * 1024 * 1024)

    @property
    def transport_backend(self) -> str:
        """The backend both ends use: ``auto`` is gloo (the workers generate on CPU)."""
        return "gloo" if self.backend == "auto" else self.backend
