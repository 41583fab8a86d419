"""The bucketed collective: each bucket is one broadcast on the worker's pair (gloo or NCCL),
what a worker on another host (or one that maps no shared memory) receives.

Two buffers each side: the trainer packs bucket i+1 while bucket i is on the wire, the worker
unpacks bucket i while bucket i+1 arrives. A bucket holding a single contiguous tensor goes on
the wire in place, without packing. When the shared slots in host memory serve local workers
in the same broadcast, their packed bucket is this way's wire too (packed once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from ..buckets import Bucket, pack, unpack
from ..manifest import Prepared
from ..pair import Pair
from ..results import TransferStats, transfer_stats
from .base import Message

__all__ = ["Collective", "WireBuffers", "receive", "typed"]


def typed(buf: Tensor, bucket: Bucket) -> Tensor:
    """The first ``bucket.nbytes`` of a byte buffer, viewed as the bucket's dtype."""
    return buf[: bucket.nbytes].view(bucket.dtype)


class WireBuffers:
    """Two byte buffers on the wire's device, big enough for the largest packed bucket,
    reused across transfers."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: list[Tensor] = []

    def get(self, buckets: list[Bucket], tensors: Mapping[str, Tensor]) -> list[Tensor]:
        need = max((b.nbytes for b in buckets if self.direct(b, tensors) is None), default=0)
        if len(self._buffers) != 2 or self._buffers[0].numel() < need:
            self._buffers = [
                torch.empty(max(need, 8), dtype=torch.uint8, device=self.device) for _ in range(2)
            ]
        return self._buffers

    def direct(self, bucket: Bucket, tensors: Mapping[str, Tensor]) -> Tensor | None:
        """The tensor's own bytes when a one-tensor bucket can go on the wire without a copy."""
        if len(bucket.specs) != 1:
            return None
        t = tensors[bucket.specs[0].name]
        if t.device != self.device or not t.is_contiguous() or t.numel() == 0:
            return None
        if t.dtype != bucket.dtype:  # cast while packing
            return None
        return t.detach().reshape(-1).view(torch.uint8)

    def clear(self) -> None:
        self._buffers = []


class Collective:
    """The trainer's end: each bucket broadcast on every worker's pair."""

    kind = "collective"
    by_bucket = True

    def __init__(self, buffers: WireBuffers) -> None:
        self.buffers = buffers
        self.workers: dict[int, Pair] = {}
        self._wire: Tensor | None = None
        self._bufs: list[Tensor] = []

    def add(self, worker: int, pair: Pair) -> None:
        self.workers[worker] = pair

    def stage(
        self, i: int, bucket: Bucket, prep: Prepared, host_copy: Tensor | None
    ) -> Tensor | None:
        self._wire = host_copy
        if host_copy is None:
            self._wire = self.buffers.direct(bucket, prep.tensors)
            if self._wire is None:
                if not self._bufs:
                    self._bufs = self.buffers.get(prep.buckets, prep.tensors)
                self._wire = pack(bucket, prep.tensors, out=typed(self._bufs[i % 2], bucket))
        return host_copy

    def post(self, i: int, pair: Pair) -> list[Message]:
        assert self._wire is not None
        return [(pair.broadcast(self._wire.view(torch.uint8)), None, False)]

    def finish(self, failed: dict[int, str]) -> None:
        self._wire, self._bufs = None, []


def receive(
    pair: Pair,
    prep: Prepared,
    buffers: WireBuffers,
    sync_device: Callable[[], None],
    start: float,
) -> TransferStats:
    """The worker's end: every bucket from the pair, unpacked into the model's tensors (or
    received into a tensor in place)."""
    tensors, buckets = prep.tensors, prep.buckets
    bufs = buffers.get(buckets, tensors)
    # posted[j] = (bucket, work, flat buffer to unpack or None when received in place)
    posted: list[tuple[Bucket, dist.Work, Tensor | None]] = []

    def post(i: int) -> None:
        bucket = buckets[i]
        wire = buffers.direct(bucket, tensors)
        flat = None
        if wire is None:
            flat = typed(bufs[i % 2], bucket)
            wire = flat.view(torch.uint8)
        posted.append((bucket, pair.broadcast(wire), flat))

    if buckets:
        post(0)
    for i in range(len(buckets)):
        if i + 1 < len(buckets):
            post(i + 1)  # its buffer slot was released when bucket i-1 was unpacked
        bucket, work, flat = posted[i]
        work.wait()
        if flat is not None:
            unpack(bucket, flat, tensors)
    sync_device()
    return transfer_stats(start, prep.manifest, len(buckets))
