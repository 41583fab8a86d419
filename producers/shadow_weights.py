"""The in-flight weight update's second buffer (``async_training.in_flight_update``).

A thread receives each version's weights into a shadow copy of the policy while the worker
keeps generating with the live one; the worker copies the shadow into the live model between
two tokens (``swap_into``), which takes a memory copy, not a transfer. One transfer is held at
a time: the thread receives the next only after the previous one was swapped in, so the
trainer's next broadcast waits at most one decoding step for it.

The thread starts after the worker's join (whose transfer is received in place, as before),
and ends when a transfer fails (the trainer is gone: ``error`` says why, and the worker
rejoins) or the worker closes it. Memory: one more copy of the weights on the worker's device.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from asyncrl.config import RunConfig
from asyncrl.models.flat import copy_model
from asyncrl.producers.engines.base import Engine
from asyncrl.producers.in_flight import InFlightSamples
from asyncrl.sync.checksum import weights_checksum
from asyncrl.sync.copy_plan import CopyPlan
from asyncrl.sync.results import ManifestMismatchError
from asyncrl.sync.transport import WeightSink

log = logging.getLogger(__name__)


class ShadowWeights:
    def __init__(
        self, sink: WeightSink, model: torch.nn.Module, bucket_bytes: int, checksum: bool
    ) -> None:
        self.sink = sink
        self.bucket_bytes = bucket_bytes
        self.checksum = checksum
        self.shadow = copy_model(model)  # tied weights still tied (the same manifest), flat
        # where the model is: each swap is then one copy
        self.shadow.requires_grad_(False)
        self.ready = threading.Event()
        """A transfer is in the shadow, not swapped in yet."""
        self._free = threading.Event()
        self._free.set()
        self._closed = False
        self.error: Exception | None = None
        self.received_checksum = ""
        self.like: str | None = None
        """The trainer's last checksum: the received weights are hashed in its format
        (sync/checksum.py), ahead of the WeightsPublished they are compared with."""
        self.receive_s = 0.0
        self._thread = threading.Thread(target=self._receive, name="shadow-weights", daemon=True)
        self._thread.start()

    @classmethod
    def after_join(
        cls, cfg: RunConfig, sink: WeightSink | None, model: torch.nn.Module
    ) -> ShadowWeights | None:
        """The shadow of a worker that has joined the collective (``sink``), if the run
        updates in flight; None if it does not."""
        if not cfg.async_training.in_flight_update:
            return None
        assert sink is not None, "join the weight collective first"
        return cls(sink, model, cfg.sync.bucket_bytes, cfg.sync.verify_checksum)

    def _receive(self) -> None:
        while True:
            self._free.wait()
            if self._closed:
                return
            self._free.clear()
            try:
                stats = self.sink.receive_into(self.shadow, self.bucket_bytes)
            except Exception as err:  # the pair failed (the trainer died), or a mismatch
                if not self._closed:
                    self.error = err
                    self.ready.set()
                return
            # The transfer, not the wait for the trainer's next sync that comes before it
            # (with a sync every step, most of a step: the report's "receive + load").
            self.receive_s = stats.seconds - stats.waited_s
            checksum = weights_checksum(self.shadow, like=self.like) if self.checksum else ""
            self.received_checksum = checksum
            self.ready.set()

    def failed(self) -> str | None:
        """Why the background transfer failed (the trainer is gone: rejoin), or None. A
        manifest mismatch is a configuration error: it raises."""
        if isinstance(self.error, ManifestMismatchError):
            raise self.error
        return None if self.error is None else f"the weight transfer failed ({self.error})"

    def swap(self, engine: Engine, in_flight: InFlightSamples, version: int) -> tuple[str, float]:
        """Steps 2-5 of a sync without a pause: the trajectories in flight are cut after their
        last token, the received weights copied into ``model``, and they go on as a new
        segment under ``version``. Returns the weights' checksum and the seconds it took."""
        t0 = time.monotonic()
        in_flight.interrupt()
        checksum = engine.update_weights(self._copy_into)
        in_flight.continue_all(version)
        return checksum, time.monotonic() - t0

    def _copy_into(self, model: torch.nn.Module) -> str:
        """Copy the received weights into ``model`` (in place, between two decoding steps) and
        let the thread receive the next transfer; returns the received weights' checksum."""
        assert self.ready.is_set() and self.error is None
        pairs = [
            *zip(model.parameters(), self.shadow.parameters(), strict=True),
            *zip(model.buffers(), self.shadow.buffers(), strict=True),
        ]
        # A flat model (on a GPU, models.flat) and its deep copy: one copy in all.
        CopyPlan(pairs, way="large_apart").run()
        checksum = self.received_checksum
        self.ready.clear()
        self._free.set()
        return checksum

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread: at once if it waits for a swap; a thread blocked in a receive ends
        when the transfer ends or fails (it is a daemon: it never holds the process)."""
        self._closed = True
        self._free.set()
        self._thread.join(timeout)
