"""A two-process group (trainer rank 0, worker rank 1) built directly on the trainer's store,
and the few messages a transfer is made of: one-number signals, an opening, an acknowledgement,
an exchange of bytes.

Each worker incarnation has a pair of its own under the key ``worker/incarnation``, so a
restarted worker forms a new pair and a dead one's pair fails alone (``sync.rendezvous``).
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from .fast_channel import check_ack, recv_number, send_number

__all__ = ["AWAIT_SLICE_S", "FULL", "Pair"]

FULL = -1
"""A transfer's opening token when a manifest check comes first; an epoch (>= 0) instead
says the weights are final and readable in place under that epoch."""
AWAIT_SLICE_S = 0.5
"""How often a worker waiting for the trainer's opening looks up to poll its consumer group
(its max.poll.interval.ms is a few seconds: a worker that stops polling leaves the group)."""


class Pair:
    """A two-process group (trainer rank 0, worker rank 1) built directly on the store."""

    def __init__(
        self,
        store: dist.Store,
        key: str,
        rank: int,
        backend: str,
        device: torch.device,
        timeout_s: float,
        op_timeout_s: float,
    ) -> None:
        self.key = key
        """worker/incarnation: what the worker's fast channel introduces itself with."""
        prefixed = dist.PrefixStore(f"pair/{key}/", store)
        timeout = timedelta(seconds=timeout_s)
        # torch's stubs make ProcessGroupGloo/NCCL a Backend without the collectives (broadcast,
        # allgather) ProcessGroup has and they have too: typed as a ProcessGroup.
        if backend == "gloo":
            self.pg: dist.ProcessGroup = dist.ProcessGroupGloo(prefixed, rank, 2, timeout)  # type: ignore[assignment]
        else:  # pragma: no cover - needs two CUDA processes
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, 2, opts)  # type: ignore[assignment]
        self.pg.set_timeout(timedelta(seconds=op_timeout_s))
        self.device = device
        self.op_timeout_s = op_timeout_s
        self._opening: tuple[dist.Work, Tensor] | None = None
        """The worker's end of the next ``open``, posted early by ``await_opening``."""
        self.fast: socket.socket | None = None
        """Both ends on one host, the worker reading in place: the fast channel
        (``sync.fast_channel``) that carries each transfer's opening number and the worker's
        acknowledgement. Set at both ends in the exchange where the worker maps the weights."""

    def broadcast(self, tensor: Tensor, root: int = 0) -> dist.Work:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return self.pg.broadcast([tensor], opts)

    def signal(self, root: int, value: int) -> tuple[dist.Work, Tensor]:
        """A one-number message from ``root`` (a bucket's token or its acknowledgement)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        return self.broadcast(t, root), t

    def open(self, value: int) -> None:
        """The trainer's opening number of a transfer (``FULL``: a manifest check follows;
        an epoch: read the weights in place), on the fast channel where there is one."""
        if self.fast is not None:
            send_number(self.fast, value, "the worker")
        else:
            self.signal(0, value)[0].wait()

    def take(self) -> int:
        """The worker's end of ``open``."""
        if self.fast is not None:
            return recv_number(self.fast, "the trainer")
        work, token = self._opening or self.signal(0, FULL)
        self._opening = None
        work.wait()
        return int(token.item())

    def await_opening(self, waiting: Callable[[], None]) -> None:
        """Until the trainer's opening has arrived (``take`` then returns at once), failed, or
        ``op_timeout_s`` passed (``take`` then fails as it would have), calling ``waiting``
        every ``AWAIT_SLICE_S``: the trainer opens a sync's transfer once every worker has
        paused, which one stopped worker can make a long wait."""
        deadline = time.monotonic() + self.op_timeout_s
        if self.fast is not None:
            while not select.select([self.fast], [], [], AWAIT_SLICE_S)[0]:
                if time.monotonic() > deadline:
                    return
                waiting()
            return
        if self._opening is None:
            self._opening = self.signal(0, FULL)
        work, last = self._opening[0], time.monotonic()
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.0005)  # a gloo pair crosses hosts: its transfer takes far longer
            if time.monotonic() - last >= AWAIT_SLICE_S:
                waiting()
                last = time.monotonic()

    def acknowledge(self, value: int) -> None:
        """The worker's word that it has read the epoch ``value`` (the trainer may step)."""
        if self.fast is not None:
            send_number(self.fast, value, "the trainer")
        else:
            self.signal(1, value)[0].wait()

    def acknowledgement(self, value: int) -> Callable[[], None]:
        """The trainer's end of ``acknowledge``, posted now (after ``open``) and awaited by
        calling the result, which raises if the worker acknowledged another epoch."""
        fast = self.fast
        if fast is not None:
            return lambda: check_ack(recv_number(fast, "the worker"), value)
        work, got = self.signal(1, -1)

        def wait() -> None:
            work.wait()
            check_ack(int(got.item()), value)

        return wait

    def attach_fast(self, sock: socket.socket) -> None:
        sock.settimeout(self.op_timeout_s)
        self.fast = sock

    def exchange(self, data: bytes) -> tuple[bytes, bytes]:
        """Both ends' bytes (rank 0's first): lengths first, then the padded payloads."""
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(2)]
        self.pg.allgather([sizes], [size]).wait()
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(max(longest, 1), dtype=torch.uint8, device=self.device)
        mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
        both = [torch.empty_like(mine) for _ in range(2)]
        self.pg.allgather([both], [mine]).wait()
        a, b = (bytes(t[: int(s.item())].cpu().tolist()) for t, s in zip(both, sizes, strict=True))
        return a, b

    def close(self) -> None:
        if self.fast is not None:
            self.fast.close()
            self.fast = None
        with contextlib.suppress(Exception):  # a pair whose peer is gone may refuse it
            self.pg.shutdown()
