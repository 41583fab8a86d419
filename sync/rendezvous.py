"""Rendezvous and membership: how the trainer and each rollout worker find each other.

Why pairs, not one group of every process: a torch.distributed group has a fixed membership
formed once, so a worker that crashes and restarts (or one added mid-run) could never rejoin.
Here the trainer hosts a rendezvous store; each worker *incarnation* (one process lifetime,
named by a random id it announces in WorkerStarted) forms its own two-process group with the
trainer under a key of its own (``sync.pair``). A restart forms a new pair and receives the
current weights like a start-up; a dead worker's pair fails fast ("connection closed by peer")
and is dropped, without touching the others.

Joining, in order: the worker connects to the store and announces itself (WorkerStarted on
``control``, repeated every few seconds until answered, since the trainer may not be reading
yet); the trainer sets ``accept/<worker>/<incarnation>`` and builds its end of the pair; the
worker sees the key and builds its end.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

__all__ = ["ANNOUNCE_EVERY_S", "Backend", "Endpoint", "resolve_backend"]

Backend = Literal["auto", "gloo", "nccl"]
ANNOUNCE_EVERY_S = 2.0
"""How often a worker not yet accepted announces itself again."""


def resolve_backend(backend: Backend, device: torch.device) -> str:
    """The backend one end uses. ``auto`` is gloo whatever this end's device, as
    ``SyncConfig.transport_backend`` reads it: an end cannot see the other's device, and two
    ends that resolved auto by their own devices (a GPU worker to nccl, a trainer sending
    from CPU buckets to gloo) would never pair. nccl only when set, on a CUDA device."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"sync.backend must be auto, gloo or nccl, got {backend!r}")
    if backend == "auto":
        backend = "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"sync.backend=nccl needs a CUDA device, got {device}")
    return backend


class Endpoint:
    """What both ends share: where the trainer's store listens, the backend, the device."""

    role = "?"

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        backend: Backend = "auto",
        device: torch.device | str = "cpu",
        timeout_s: float = 300.0,
        shared_memory: bool = True,
    ) -> None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            # "cuda" means the current device; torch.cuda.set_device needs its index.
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        """Where this end's weights live (a trainer's or worker's model)."""
        self.backend = resolve_backend(backend, self.device)
        self.wire_device = self.device if self.backend == "nccl" else torch.device("cpu")
        """Where the collective's buffers live: gloo sends from host memory."""
        self.shared_memory = shared_memory
        self.master_addr = master_addr
        self.master_port = master_port
        self.timeout_s = timeout_s
        self._store: dist.TCPStore | None = None

    def host_store(self) -> dist.TCPStore:
        """The trainer's end: the rendezvous store, listening on master_port."""
        if self._store is None:
            try:
                self._store = dist.TCPStore(
                    self.master_addr,
                    self.master_port,
                    is_master=True,
                    wait_for_workers=False,
                    timeout=timedelta(seconds=self.timeout_s),
                )
            except Exception as err:
                raise self.rendezvous_error("hosting the rendezvous store", err) from err
        return self._store

    def join_store(
        self,
        worker: int,
        key: str,
        announce: Callable[[], None],
        waiting: Callable[[], None] | None,
    ) -> dist.TCPStore:
        """A worker's end: connected to the trainer's store once it has accepted ``key``,
        announcing every ``ANNOUNCE_EVERY_S`` meanwhile (and calling ``waiting`` between two
        announcements while the store does not answer yet)."""
        deadline = time.monotonic() + self.timeout_s
        # Short tries with an announce between them, so a worker told to stop is heard.
        announced = -ANNOUNCE_EVERY_S
        while not _listening(self.master_addr, self.master_port):
            if time.monotonic() > deadline:
                break  # the store's connect below fails and says so
            if time.monotonic() - announced >= ANNOUNCE_EVERY_S or waiting is None:
                announce()
                announced = time.monotonic()
            else:
                waiting()
            time.sleep(0.5)
        try:
            store = dist.TCPStore(
                self.master_addr,
                self.master_port,
                is_master=False,
                timeout=timedelta(seconds=self.timeout_s),
            )
        except Exception as err:
            raise self.rendezvous_error("connecting to the trainer's store", err) from err
        while True:
            announce()
            try:
                store.wait([f"accept/{key}"], timedelta(seconds=ANNOUNCE_EVERY_S))
                return store
            except dist.DistNetworkError as err:  # the trainer's store is gone: it died
                raise ConnectionError(f"the trainer's store went away ({err})") from err
            except Exception as err:  # not accepted yet: announce again
                if time.monotonic() > deadline:
                    raise self.rendezvous_error(
                        f"worker {worker} waiting to be accepted by the trainer", err
                    ) from err

    def sync_device(self) -> None:
        """Wait for queued GPU work, so the stats time the transfer and not just its launch."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def rendezvous_error(self, what: str, err: Exception) -> RuntimeError:
        return RuntimeError(
            f"weight collective: {what} failed ({self.backend}, "
            f"{self.master_addr}:{self.master_port}, timeout {self.timeout_s:g} s): "
            f"{type(err).__name__}: {err}. Check that sync.master_addr/sync.master_port "
            "name the trainer's host and a port free there, the same for the trainer and "
            "every worker, and that the trainer is running (sync.timeout_s bounds the wait)."
        )


def _listening(host: str, port: int) -> bool:
    """Something accepts connections at ``host:port`` (the trainer's store, once it is up)."""
    try:
        with socket.create_connection((host, port), timeout=ANNOUNCE_EVERY_S):
            return True
    except OSError:
        return False
