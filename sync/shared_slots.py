"""Two bucket slots in memory the trainer shares with the rollout workers on its host.

Why: between processes on one machine the collective copies every byte through a loopback
socket (gloo moves ~2 GB/s here, a memory copy ~5 GB/s). A worker on the trainer's host can
instead read each packed bucket straight from the trainer's memory; the pair then carries only
a token per bucket ("bucket i is in slot i % 2") and an acknowledgement ("slot free again").

The memory is an anonymous ``memfd`` (Linux): nothing is named in ``/dev/shm``, so nothing
leaks when the trainer is killed, and the tmpfs size limit of a container's ``/dev/shm``
(64 MB by default) does not apply. A worker maps it through ``/proc/<trainer pid>/fd/<fd>``,
which works for a process of the same user in the same PID namespace; the first bytes hold a
random nonce the trainer also sends in its offer, so a worker that opened some other file
(another PID namespace) sees the mismatch and the pair falls back to the collective.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["SharedSlots", "SlotsOffer", "SlotsView", "host_id"]

_HEADER = 64
"""Bytes before the first slot: the nonce, padded so that every slot starts 64-byte aligned."""
_ALIGN = 64


def host_id() -> str:
    """This machine as both ends can compare it: host name and kernel boot id (containers on
    one host have host names of their own, so they compare unequal and keep the collective)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else ""
    return f"{socket.gethostname()}/{boot_id}"


@dataclass(frozen=True)
class SlotsOffer:
    """What the trainer tells a worker about its slots (JSON on the pair, never pickled)."""

    pid: int
    fd: int
    nonce: str
    slot_bytes: int

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"

    @property
    def nbytes(self) -> int:
        return _HEADER + 2 * self.slot_bytes

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "fd": self.fd, "nonce": self.nonce, "slot_bytes": self.slot_bytes}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SlotsOffer:
        return cls(int(d["pid"]), int(d["fd"]), str(d["nonce"]), int(d["slot_bytes"]))


class _Mapped:
    """A shared mapping of the slots' memory: the nonce, then two slots of ``slot_bytes``."""

    def __init__(self, path: str, offer: SlotsOffer) -> None:
        self.offer = offer
        self.memory = torch.from_file(path, shared=True, size=offer.nbytes, dtype=torch.uint8)

    def slot(self, i: int) -> Tensor:
        start = _HEADER + (i % 2) * self.offer.slot_bytes
        return self.memory[start : start + self.offer.slot_bytes]


class SharedSlots(_Mapped):
    """The trainer's end: creates the memory; ``close`` releases it (the workers' mappings
    stay valid until they drop them)."""

    def __init__(self, slot_bytes: int) -> None:
        if not hasattr(os, "memfd_create"):
            raise OSError("shared weight slots need Linux (os.memfd_create)")
        slot_bytes = -(-max(slot_bytes, 8) // _ALIGN) * _ALIGN
        nonce = secrets.token_hex(16)
        fd = os.memfd_create("asyncrl-weights", os.MFD_CLOEXEC)
        try:
            offer = SlotsOffer(os.getpid(), fd, nonce, slot_bytes)
            os.ftruncate(fd, offer.nbytes)
            super().__init__(f"/proc/self/fd/{fd}", offer)
        except Exception:
            os.close(fd)
            raise
        self.memory[: len(nonce)] = torch.frombuffer(bytearray(nonce.encode()), dtype=torch.uint8)
        self._fd: int | None = fd

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.offer.slot_bytes

    def close(self) -> None:
        self.memory = torch.empty(0, dtype=torch.uint8)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class SlotsView(_Mapped):
    """A worker's mapping of the trainer's slots."""

    def __init__(self, offer: SlotsOffer) -> None:
        super().__init__(offer.path, offer)
        found = bytes(self.memory[: len(offer.nonce)].tolist()).decode(errors="replace")
        if found != offer.nonce:
            raise OSError(f"{offer.path} is not the trainer's weight memory (nonce mismatch)")
