"""What a weight transfer reports: its statistics, who received it, and the one error that is
a configuration fault (the two ends disagree on the tensors)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .buckets import TensorSpec

__all__ = ["BroadcastResult", "ManifestMismatchError", "TransferStats", "transfer_stats"]


class ManifestMismatchError(RuntimeError):
    """The trainer and a worker disagree on which tensors (or which buckets) to transfer."""


@dataclass
class TransferStats:
    """What one transfer moved (per receiver) and how long it took (digest check included)."""

    bytes: int
    seconds: float
    buckets: int
    tensors: int
    shared: int = 0
    """Workers that read the weights from the trainer's shared memory (the others got them
    over the collective)."""
    medium: str = "collective"
    """How the bytes moved: collective; memfd or cuda (the shared slots); direct_memfd or
    direct_cuda (the trainer's weights read in place): a worker's end, or the kinds its
    workers read, joined by + (the trainer's end)."""
    checked: bool = True
    """The manifest was checked in this transfer (every one but a worker's reads in place
    after the first of an epoch: a trainer's end, False when no worker needed it)."""
    copy_s: float | None = None
    """A worker's end, reading in place: the time of its copy alone (device time on a GPU),
    the rest of ``seconds`` being signals and waits."""
    copy_way: str = ""
    """A worker's end, reading in place: how it copied (``sync.copy_plan.WAYS``)."""
    waited_s: float = 0.0
    """A worker's end: of ``seconds``, the wait for the trainer to start the transfer (an
    in-flight update's receiving thread waits there for the trainer's next sync)."""

    @property
    def gbps(self) -> float:
        """Throughput in gigabytes (1e9 bytes) per second."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass
class BroadcastResult:
    """A send to several workers: who got the weights, and why the others did not."""

    stats: TransferStats
    delivered: dict[int, str] = field(default_factory=dict)
    """worker -> incarnation, for every pair that received every bucket."""
    failed: dict[int, str] = field(default_factory=dict)
    """worker -> error; these pairs are closed (the worker must join again)."""


def transfer_stats(
    start: float,
    manifest: list[TensorSpec],
    buckets: int,
    shared: int = 0,
    medium: str = "collective",
    checked: bool = True,
) -> TransferStats:
    """The stats of a transfer that began at ``start`` (``time.perf_counter``) and ends now."""
    return TransferStats(
        bytes=sum(s.nbytes for s in manifest),
        seconds=time.perf_counter() - start,
        buckets=buckets,
        tensors=len(manifest),
        shared=shared,
        medium=medium,
        checked=checked,
    )
