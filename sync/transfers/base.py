"""The interface every way of moving weights implements at the trainer's end, and the bucket
pipeline that serves the ways that go bucket by bucket.

A broadcast (``sync.sender``) checks each worker's manifest, hands the worker to one way
(``add``), then runs the pipeline: per bucket, every way puts the bucket where its workers read
it (``stage``), then posts each worker's messages (``post``); two buffers alternate, so bucket
i+1 is packed while bucket i is on the wire. ``finish`` ends a way's transfer. The worker's end
of each way is a function in the same file (``receive``).

A new way (another medium, another group: NCCL across the ranks of a sharded trainer) is one
new file here with a class of this shape, and a line in the sender's assignment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch.distributed as dist
from torch import Tensor

from ..buckets import Bucket
from ..manifest import Prepared
from ..pair import Pair

__all__ = ["Message", "Transfer", "serve_buckets"]

log = logging.getLogger(__name__)

Message = tuple[dist.Work, Tensor | None, bool]
"""One posted message of a worker's pair: its work, its tensor (a signal's number), and
whether it is the worker's acknowledgement."""


class Transfer(Protocol):
    """The trainer's end of one way of moving weights, for one broadcast."""

    kind: str
    """How the bytes move (``TransferStats.medium``)."""
    by_bucket: bool
    """Served by ``serve_buckets`` (False: the way moves everything in ``add``/``finish``)."""
    workers: dict[int, Pair]
    """The workers this way serves in this broadcast, while none of their messages failed."""

    def add(self, worker: int, pair: Pair) -> None:
        """Serve ``worker`` in this broadcast (its manifest checked, or known)."""
        ...

    def stage(
        self, i: int, bucket: Bucket, prep: Prepared, host_copy: Tensor | None
    ) -> Tensor | None:
        """Put bucket ``i`` where this way's workers read it; returns the bucket packed in
        host memory, if this way (or one before it: ``host_copy``) packed it there."""
        ...

    def post(self, i: int, pair: Pair) -> list[Message]:
        """Bucket ``i``'s messages to one worker."""
        ...

    def finish(self, failed: dict[int, str]) -> None:
        """End this way's transfer; a worker that failed goes to ``failed`` (and out of
        ``workers``)."""
        ...


def serve_buckets(
    prep: Prepared,
    ways: Sequence[Transfer],
    failed: dict[int, str],
    unacked: list[tuple[int, Pair, dist.Work, Tensor | None]],
) -> bool:
    """Serve every bucket to the workers of ``ways`` that go by bucket, two buffers in turn.
    A worker whose message fails goes to ``failed``. The final acknowledgements still
    outstanding go to ``unacked`` (awaited before the memory is written again). True when a
    bucket was packed or sent (this end's GPU work may be queued)."""
    ways = [w for w in ways if w.by_bucket and w.workers]
    # per buffer slot: (worker, way, work, its tensor, whether it is an acknowledgement)
    pending: list[list[tuple[int, Transfer, dist.Work, Tensor | None, bool]]] = [[], []]

    def drop(w: int, way: Transfer, err: Exception) -> None:
        failed[w] = f"{type(err).__name__}: {err}"
        way.workers.pop(w, None)

    def settle(slot: int, defer_acks: bool = False) -> None:
        for w, way, work, signal, ack in pending[slot]:
            if defer_acks and ack and w in way.workers:
                unacked.append((w, way.workers[w], work, signal))
                continue
            try:
                work.wait()
            except Exception as err:
                drop(w, way, err)
        pending[slot] = []

    served = False
    for i, bucket in enumerate(prep.buckets):
        if not any(way.workers for way in ways):
            break
        served = True
        slot = i % 2
        settle(slot)  # this buffer was sent two buckets ago: free to refill
        host_copy = None
        for way in ways:
            host_copy = way.stage(i, bucket, prep, host_copy)
        for way in ways:
            for w, pair in list(way.workers.items()):
                try:
                    pending[slot].extend((w, way, *m) for m in way.post(i, pair))
                except Exception as err:
                    drop(w, way, err)
    settle(0, defer_acks=True)
    settle(1, defer_acks=True)
    return served
