"""The weight transport: how a version's weights get from the trainer into each rollout worker.

Two ends, each a small interface, and a factory choosing the backend from the config. Today's
backend is the collective (``sync.sender`` and ``sync.receiver``: a torch.distributed pair per
worker incarnation, gloo or NCCL); ``asyncrl.testing.LocalWeights`` moves them between objects
of one process (tests). Workers on the trainer's host read the weights from shared memory,
negotiated per transfer inside the collective's pair (``sync.negotiation``); each way of
moving the bytes is a file in ``sync.transfers``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import torch

from asyncrl.config import RunConfig
from asyncrl.sync.receiver import WeightReceiver
from asyncrl.sync.results import BroadcastResult, TransferStats
from asyncrl.sync.sender import WeightSender

log = logging.getLogger(__name__)


class WeightSource(Protocol):
    """The trainer's end: a membership of worker incarnations, and a broadcast to them."""

    @property
    def members(self) -> dict[int, str]:
        """worker -> incarnation of every connected worker."""
        ...

    def connect(self, worker: int, incarnation: str) -> bool:
        """Accept an announced worker incarnation; False if its end never came."""
        ...

    def disconnect(self, worker: int) -> None: ...

    def broadcast(
        self,
        model: torch.nn.Module,
        bucket_bytes: int,
        workers: list[int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> BroadcastResult:
        """Send the model's weights to ``workers`` (default: every member), floating-point
        ones cast to ``dtype`` (the workers' ``rollout.dtype``; None: as they are)."""
        ...

    def close(self) -> None: ...


class WeightSink(Protocol):
    """A worker's end: join the trainer's membership, then receive weights in place."""

    def join(
        self,
        worker: int,
        incarnation: str,
        announce: Callable[[], None],
        waiting: Callable[[], None] | None = None,
    ) -> None:
        """Until accepted, calling ``announce`` (WorkerStarted) now and then, ``waiting``
        between two announcements."""
        ...

    def await_transfer(self, waiting: Callable[[], None]) -> None:
        """Until the trainer opens its next transfer, calling ``waiting`` now and then: a
        sync's transfer opens once every worker has paused, which one stopped worker can
        delay for seconds, and the caller must keep polling its consumer group meanwhile."""
        ...

    def receive_into(self, model: torch.nn.Module, bucket_bytes: int) -> TransferStats: ...

    def close(self) -> None: ...


def make_source(cfg: RunConfig, device: torch.device) -> WeightSource | None:
    """The trainer's end, started (its rendezvous store listening), or None when there is no
    one to send to (no workers configured and no port: trained from samples already logged)."""
    sc = cfg.sync
    if cfg.actor_rollout_ref.rollout.num_workers == 0 and sc.master_port is None:
        return None
    backend = sc.transport_backend
    sender = WeightSender(
        master_addr=sc.master_addr,
        master_port=_port(cfg),
        backend=backend,
        device=device,  # gloo sends from host buffers whatever this device (wire_device)
        timeout_s=sc.timeout_s,
        shared_memory=sc.shared_memory,
    )
    sender.start()
    log.info(
        "weight sync over %s from %s buffers on port %d",
        backend,
        sender.wire_device,
        sc.master_port,
    )
    return sender


def make_sink(cfg: RunConfig, device: torch.device) -> WeightSink:
    """A worker's end, for a model on ``device``."""
    sc = cfg.sync
    return WeightReceiver(
        master_addr=sc.master_addr,
        master_port=_port(cfg),
        backend=sc.transport_backend,
        device=device,
        timeout_s=sc.timeout_s,
        shared_memory=sc.shared_memory,
    )


def _port(cfg: RunConfig) -> int:
    if cfg.sync.master_port is None:
        raise RuntimeError("sync.master_port is not set (the launcher sets it for each run)")
    return cfg.sync.master_port
