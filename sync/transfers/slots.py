"""Shared slots: the trainer packs each bucket into one of two slots of memory it shares with
the workers on its host (``sync.shared_slots``); the pair carries only a token per bucket
("bucket i is in slot i % 2") and the worker's acknowledgement ("slot free again"). One packed
copy serves every local worker."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..buckets import Bucket, pack, unpack
from ..manifest import Prepared
from ..pair import Pair
from ..results import TransferStats, transfer_stats
from ..shared_slots import SharedSlots, SlotsView
from .base import Message
from .collective import typed

__all__ = ["Slots", "receive"]


class Slots:
    """The trainer's end, for the slots of one kind (``memfd``: host memory, ``cuda``)."""

    by_bucket = True

    def __init__(self, kind: str, slots: SharedSlots) -> None:
        self.kind = kind
        self.slots = slots
        self.workers: dict[int, Pair] = {}

    def add(self, worker: int, pair: Pair) -> None:
        self.workers[worker] = pair

    def stage(
        self, i: int, bucket: Bucket, prep: Prepared, host_copy: Tensor | None
    ) -> Tensor | None:
        out = typed(self.slots.slot(i), bucket)
        if self.kind != "memfd":  # GPU memory: packed on the GPU, then waited for
            pack(bucket, prep.tensors, out=out)
            self.slots.synchronize()
            return host_copy
        return pack(bucket, prep.tensors, out=out)  # also the collective's wire

    def post(self, i: int, pair: Pair) -> list[Message]:
        """ "bucket i is in its slot", then "slot read"."""
        return [(*pair.signal(0, i), False), (*pair.signal(1, i), True)]

    def finish(self, failed: dict[int, str]) -> None:
        pass


def receive(
    pair: Pair,
    view: SlotsView,
    prep: Prepared,
    sync_device: Callable[[], None],
    start: float,
) -> TransferStats:
    """The worker's end: each bucket from the slot the trainer's token names, acknowledged
    once copied."""
    tensors, buckets = prep.tensors, prep.buckets
    acks = []
    for i, bucket in enumerate(buckets):
        work, token = pair.signal(0, -1)
        work.wait()
        if int(token.item()) != i:
            raise RuntimeError(f"weight slots out of step: token {int(token)} for bucket {i}")
        unpack(bucket, typed(view.slot(i), bucket), tensors)
        view.synchronize()  # copied out before the slot is handed back
        sync_device()
        acks.append(pair.signal(1, i))
    for work, _ in acks:
        work.wait()
    return transfer_stats(start, prep.manifest, len(buckets), shared=1, medium=view.offer.kind)
