"""A rollout worker's end of the weight collective: one pair with the trainer for this
process's lifetime (``sync.rendezvous``), and each transfer received the way the trainer opens
it: in place, from the shared slots, or over the bucketed collective (``sync.transfers``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .manifest import Prepared, PreparedCache, verify_manifest
from .negotiation import WorkerMemory
from .pair import FULL, Pair
from .rendezvous import Endpoint
from .results import TransferStats
from .transfers import collective, in_place, slots
from .transfers.collective import WireBuffers

__all__ = ["WeightReceiver"]


class WeightReceiver(Endpoint):
    """A worker's end: one pair with the trainer for this process's lifetime."""

    role = "worker"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pair: Pair | None = None
        self.memory = WorkerMemory(gpu=self.device.type == "cuda", enabled=self.shared_memory)
        self._prepared = PreparedCache()
        self._buffers = WireBuffers(self.wire_device)
        self.worker = -1

    def join(
        self,
        worker: int,
        incarnation: str,
        announce: Callable[[], None],
        waiting: Callable[[], None] | None = None,
    ) -> None:
        """Connect to the trainer's store and form this incarnation's pair.

        ``announce`` publishes WorkerStarted; it is called again every couple of seconds until
        the trainer accepts, since the trainer may not have been reading the first time.
        ``waiting`` is called between two announcements while the store does not answer yet
        (a stop is heard there).
        """
        if self._pair is not None:
            return
        self.worker = worker
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        key = f"{worker}/{incarnation}"
        store = self.join_store(worker, key, announce, waiting)
        try:
            self._pair = Pair(
                store, key, 1, self.backend, self.wire_device, self.timeout_s, self.timeout_s
            )
        except Exception as err:
            raise self.rendezvous_error(f"worker {worker} forming its pair", err) from err

    def await_transfer(self, waiting: Callable[[], None]) -> None:
        """Until the trainer opens its next transfer, calling ``waiting`` now and then (the
        worker polls its consumer group meanwhile); ``receive_into`` follows."""
        if self._pair is not None:
            self._pair.await_opening(waiting)

    def receive_into(
        self, model: nn.Module | Mapping[str, Tensor], bucket_bytes: int
    ) -> TransferStats:
        """Receive the trainer's next transfer into ``model``'s tensors, in place."""
        if self._pair is None:
            raise RuntimeError("WeightReceiver.join() must be called before a transfer")
        pair = self._pair
        start = time.perf_counter()
        prep = self._prepared.prepare(
            model, bucket_bytes
        )  # before the trainer's word: off its clock
        asked = time.perf_counter()
        opening = pair.take()
        waited = time.perf_counter() - asked
        stats = self._receive(pair, prep, bucket_bytes, opening, start)
        stats.waited_s = waited
        return stats

    def _receive(
        self, pair: Pair, prep: Prepared, bucket_bytes: int, opening: int, start: float
    ) -> TransferStats:
        """The transfer ``opening`` (the trainer's word) begins: in place (an epoch already
        mapped, or mapped in this exchange), from the shared slots, or over the collective."""
        mem = self.memory
        if opening != FULL:
            return self._in_place(pair, prep, opening, start, checked=False)
        medium = mem.medium()
        peer = verify_manifest(pair, prep, bucket_bytes, self.worker, medium, self.role)
        kind = mem.choose(pair, peer, medium)
        if kind.startswith("direct_"):
            mem.checked_digest = prep.digest
            return self._in_place(pair, prep, pair.take(), start, checked=True)
        if kind and mem.slots is not None:
            return slots.receive(pair, mem.slots, prep, self.sync_device, start)
        return collective.receive(pair, prep, self._buffers, self.sync_device, start)

    def _in_place(
        self, pair: Pair, prep: Prepared, epoch: int, start: float, checked: bool
    ) -> TransferStats:
        mem = self.memory
        return in_place.receive(
            pair, mem.weights, prep, epoch, mem.checked_digest, self.worker,
            self.sync_device, start, checked,
        )  # fmt: skip

    def close(self) -> None:
        self.memory.close()
        self._buffers.clear()
        if self._pair is not None:
            self._pair.close()
            self._pair = None
