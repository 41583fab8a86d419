"""The weight collective: the trainer (rank 0) broadcasts its weights to every rollout worker.

One process group is created once per run and reused for every sync (a rendezvous costs
seconds; a sync should cost only the bytes). Each sync first checks that every rank derived
the same manifest and bucket plan (a 32-byte digest plus the bucket size, all-gathered), so a
mismatch is a clear error on every rank rather than a hang or silently scrambled weights.
Then each bucket is one ``dist.broadcast``; the sender packs bucket i+1 while bucket i is on
the wire, and the receivers unpack bucket i while bucket i+1 arrives (two buffers each side).
Buckets holding a single contiguous tensor are sent and received in place, without packing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .buckets import (
    Bucket,
    TensorSpec,
    manifest_digest,
    named_tensors,
    pack,
    plan_buckets,
    unpack,
    weight_manifest,
)

__all__ = ["ManifestMismatchError", "TransferStats", "WeightCollective"]

Backend = Literal["auto", "gloo", "nccl"]
_HEADER_BYTES = 32 + 8  # sha256 digest of the manifest + bucket_bytes as int64 little-endian


class ManifestMismatchError(RuntimeError):
    """The trainer and a worker disagree on which tensors (or which buckets) to transfer."""


@dataclass
class TransferStats:
    """What one sync moved and how long it took (digest check included)."""

    bytes: int
    seconds: float
    buckets: int
    tensors: int

    @property
    def gbps(self) -> float:
        """Throughput in gigabytes (1e9 bytes) per second."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


class WeightCollective:
    """A persistent torch.distributed group between the trainer (rank 0) and the workers."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        backend: Backend = "auto",
        device: torch.device | str = "cpu",
        timeout_s: float = 300.0,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"sync.backend must be auto, gloo or nccl, got {backend!r}")
        self.rank = rank
        self.world_size = world_size
        self.master_addr = master_addr
        self.master_port = master_port
        self.device = torch.device(device)
        if backend == "auto":
            backend = "nccl" if self.device.type == "cuda" else "gloo"
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"sync.backend=nccl needs a CUDA device, got {self.device}")
        self.backend: str = backend
        self.timeout_s = timeout_s
        self._group: dist.ProcessGroup | None = None
        self._buffers: list[Tensor] = []  # two byte buffers, kept across syncs

    # --- lifecycle ------------------------------------------------------------------------
    def init(self) -> None:
        """Rendezvous with every other rank (blocks until all world_size ranks have joined)."""
        if self._group is not None:
            return
        if dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is already initialised in this process; the weight "
                "collective needs its own default process group"
            )
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            dist.init_process_group(
                backend=self.backend,
                init_method=f"tcp://{self.master_addr}:{self.master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=self.timeout_s),
            )
        except Exception as err:
            raise RuntimeError(
                f"weight collective rendezvous failed (rank {self.rank}/{self.world_size}, "
                f"{self.backend}, tcp://{self.master_addr}:{self.master_port}, "
                f"timeout {self.timeout_s:g} s): {type(err).__name__}: {err}. Check that "
                f"sync.master_addr/sync.master_port are the same on the trainer and every "
                f"worker, that the port is free on the trainer host, and that all "
                f"{self.world_size} processes started (sync.timeout_s bounds the wait)."
            ) from err
        self._group = dist.group.WORLD

    def close(self) -> None:
        """Tear the group down (every rank should call it)."""
        self._buffers = []
        if self._group is not None:
            self._group = None
            if dist.is_initialized():
                dist.destroy_process_group()

    def __enter__(self) -> WeightCollective:
        self.init()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transfers ------------------------------------------------------------------------
    def broadcast_from(
        self, model: nn.Module | Mapping[str, Tensor], bucket_bytes: int
    ) -> TransferStats:
        """Trainer side: send every weight of ``model`` to all other ranks."""
        if self.rank != 0:
            raise RuntimeError(f"broadcast_from is for rank 0 (the trainer), this is {self.rank}")
        start = time.perf_counter()
        tensors, manifest, buckets = self._prepare(model, bucket_bytes)
        bufs = self._ensure_buffers(buckets, tensors)
        pending: list[dist.Work | None] = [None, None]
        for i, bucket in enumerate(buckets):
            slot = i % 2
            if pending[slot] is not None:
                pending[slot].wait()  # this buffer was sent two buckets ago: free to refill
                pending[slot] = None
            wire = self._direct(bucket, tensors)
            if wire is None:
                flat = pack(bucket, tensors, out=_typed(bufs[slot], bucket))
                wire = flat.view(torch.uint8)
            pending[slot] = dist.broadcast(wire, src=0, group=self._group, async_op=True)
        for work in pending:
            if work is not None:
                work.wait()
        self._sync_device()
        return self._stats(start, manifest, buckets)

    def receive_into(
        self, model: nn.Module | Mapping[str, Tensor], bucket_bytes: int
    ) -> TransferStats:
        """Worker side: receive the trainer's weights into ``model``'s tensors, in place."""
        if self.rank == 0:
            raise RuntimeError("receive_into is for the workers (rank >= 1); rank 0 sends")
        start = time.perf_counter()
        tensors, manifest, buckets = self._prepare(model, bucket_bytes)
        bufs = self._ensure_buffers(buckets, tensors)
        # posted[j] = (bucket, work, flat buffer to unpack or None when received in place)
        posted: list[tuple[Bucket, dist.Work, Tensor | None]] = []

        def post(i: int) -> None:
            bucket = buckets[i]
            wire = self._direct(bucket, tensors)
            flat = None
            if wire is None:
                flat = _typed(bufs[i % 2], bucket)
                wire = flat.view(torch.uint8)
            work = dist.broadcast(wire, src=0, group=self._group, async_op=True)
            posted.append((bucket, work, flat))

        if buckets:
            post(0)
        for i in range(len(buckets)):
            if i + 1 < len(buckets):
                post(i + 1)  # its buffer slot was released when bucket i-1 was unpacked
            bucket, work, flat = posted[i]
            work.wait()
            if flat is not None:
                unpack(bucket, flat, tensors)
        self._sync_device()
        return self._stats(start, manifest, buckets)

    # --- internals ------------------------------------------------------------------------
    def _prepare(
        self, model: nn.Module | Mapping[str, Tensor], bucket_bytes: int
    ) -> tuple[dict[str, Tensor], list[TensorSpec], list[Bucket]]:
        if self._group is None:
            raise RuntimeError("WeightCollective.init() must be called before a transfer")
        bucket_bytes = int(bucket_bytes)
        tensors = named_tensors(model)
        manifest = weight_manifest(tensors)
        self._verify_manifest(manifest, bucket_bytes)
        return tensors, manifest, plan_buckets(manifest, bucket_bytes)

    def _verify_manifest(self, manifest: list[TensorSpec], bucket_bytes: int) -> None:
        """All-gather (digest, bucket_bytes) so every rank knows whether every rank agrees."""
        header = bytes.fromhex(manifest_digest(manifest)) + bucket_bytes.to_bytes(8, "little")
        mine = torch.tensor(list(header), dtype=torch.uint8, device=self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self._group)
        rows = [bytes(t.cpu().tolist()) for t in gathered]
        bad = [r for r, row in enumerate(rows) if row != rows[0]]
        if not bad:
            return
        # Everyone saw the mismatch, so everyone joins this second (rare) exchange of details.
        summary = [(s.name, s.aliases, s.shape, str(s.dtype)) for s in manifest]
        everyone: list[list | None] = [None] * self.world_size
        dist.all_gather_object(everyone, summary, group=self._group)
        details = []
        for r in bad:
            sizes = int.from_bytes(rows[r][32:], "little"), int.from_bytes(rows[0][32:], "little")
            if sizes[0] != sizes[1]:
                details.append(f"rank {r} uses bucket_bytes={sizes[0]}, trainer {sizes[1]}")
            details.extend(_diff(everyone[0] or [], everyone[r] or [], r))
        raise ManifestMismatchError(
            f"weight manifest mismatch (this is rank {self.rank}); the trainer (rank 0) and "
            f"rank(s) {bad} would transfer different tensors:\n  "
            + "\n  ".join(details[:20])
            + ("\n  ..." if len(details) > 20 else "")
        )

    def _ensure_buffers(self, buckets: list[Bucket], tensors: Mapping[str, Tensor]) -> list[Tensor]:
        """Two byte buffers big enough for the largest packed bucket, reused across syncs."""
        need = max((b.nbytes for b in buckets if self._direct(b, tensors) is None), default=0)
        if len(self._buffers) != 2 or self._buffers[0].numel() < need:
            self._buffers = [
                torch.empty(max(need, 8), dtype=torch.uint8, device=self.device) for _ in range(2)
            ]
        return self._buffers

    def _direct(self, bucket: Bucket, tensors: Mapping[str, Tensor]) -> Tensor | None:
        """The tensor's own bytes when a one-tensor bucket can go on the wire without a copy."""
        if len(bucket.specs) != 1:
            return None
        t = tensors[bucket.specs[0].name]
        if t.device != self.device or not t.is_contiguous() or t.numel() == 0:
            return None
        return t.detach().reshape(-1).view(torch.uint8)

    def _sync_device(self) -> None:
        """Wait for queued GPU work, so the stats time the transfer and not just its launch."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _stats(
        self, start: float, manifest: list[TensorSpec], buckets: list[Bucket]
    ) -> TransferStats:
        return TransferStats(
            bytes=sum(s.nbytes for s in manifest),
            seconds=time.perf_counter() - start,
            buckets=len(buckets),
            tensors=len(manifest),
        )


def _typed(buf: Tensor, bucket: Bucket) -> Tensor:
    """The first ``bucket.nbytes`` of a byte buffer, viewed as the bucket's dtype."""
    return buf[: bucket.nbytes].view(bucket.dtype)


def _diff(ref: list, other: list, rank: int) -> list[str]:
    """Human-readable differences between the trainer's manifest summary and a worker's."""
    a = {row[0]: row for row in ref}
    b = {row[0]: row for row in other}
    out = []
    for name in sorted(a.keys() - b.keys()):
        out.append(f"{name}: on the trainer, missing on rank {rank}")
    for name in sorted(b.keys() - a.keys()):
        out.append(f"{name}: on rank {rank}, not on the trainer")
    for name in sorted(a.keys() & b.keys()):
        (_, ta, sa, da), (_, tb, sb, db) = a[name], b[name]
        if (sa, da) != (sb, db):
            out.append(f"{name}: trainer {da} {list(sa)}, rank {rank} {db} {list(sb)}")
        elif ta != tb:
            out.append(f"{name}: tied to {list(ta)} on the trainer, {list(tb)} on rank {rank}")
    return out or [f"rank {rank}: manifests differ in order"]
