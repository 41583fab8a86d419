"""Two bucket slots in memory the trainer shares with the rollout workers on its host.

Why: between processes on one machine the collective copies every byte through a loopback
socket (gloo moves ~2 GB/s here, a memory copy ~5 GB/s). A worker on the trainer's host can
instead read each packed bucket straight from the trainer's memory; the pair then carries only
a token per bucket ("bucket i is in slot i % 2") and an acknowledgement ("slot free again").

Two kinds of memory:

- ``memfd`` (host memory, Linux): an anonymous file, so nothing is named in ``/dev/shm``,
  nothing leaks when the trainer is killed, and the tmpfs size limit of a container's
  ``/dev/shm`` (64 MB by default) does not apply. A worker maps it through
  ``/proc/<trainer pid>/fd/<fd>``, which works for a process of the same user in the same PID
  namespace.
- ``cuda`` (GPU memory): a buffer on the trainer's GPU that a worker on a GPU of the same host
  opens by its CUDA IPC handle (torch's ``_share_cuda_`` / ``_new_shared_cuda``, what
  ``torch.multiprocessing`` uses, with the handle sent as JSON instead of a pickle), so a
  bucket goes GPU to GPU without touching host memory; every failure to create or open it
  falls back to the collective.

Either way the first bytes hold a random nonce the trainer also sends in its offer, so a
worker that opened something else (another PID namespace) sees the mismatch and the pair
falls back to the collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = [
    "SharedSlots",
    "SlotsOffer",
    "SlotsView",
    "cuda_uuid",
    "host_id",
    "local_cuda_device",
    "open_cuda_storage",
]

_HEADER = 64
"""Bytes before the first slot: the nonce, padded so that every slot starts 64-byte aligned."""
_ALIGN = 64


def host_id() -> str:
    """This machine as both ends can compare it: host name and kernel boot id (containers on
    one host have host names of their own, so they compare unequal and keep the collective)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else ""
    return f"{socket.gethostname()}/{boot_id}"


Kind = Literal["memfd", "cuda"]


@dataclass(frozen=True)
class SlotsOffer:
    """What the trainer tells a worker about its slots (JSON on the pair, never pickled).

    ``memfd``: ``pid`` and ``fd`` locate the file. ``cuda``: ``ipc`` holds the fields of
    torch's ``_share_cuda_`` (bytes as hex) and ``device_uuid`` the trainer's GPU."""

    kind: Kind
    nonce: str
    slot_bytes: int
    pid: int = 0
    fd: int = -1
    ipc: tuple[Any, ...] = ()
    device_uuid: str = ""

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"

    @property
    def nbytes(self) -> int:
        return _HEADER + 2 * self.slot_bytes

    def as_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ipc"] = [v.hex() if isinstance(v, bytes) else v for v in self.ipc]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SlotsOffer:
        kind = d.get("kind", "memfd")
        if kind not in ("memfd", "cuda"):
            raise ValueError(f"unknown kind of weight slots: {kind!r}")
        return cls(
            kind=kind,
            nonce=str(d["nonce"]),
            slot_bytes=int(d["slot_bytes"]),
            pid=int(d.get("pid", 0)),
            fd=int(d.get("fd", -1)),
            ipc=tuple(d.get("ipc", ())),
            device_uuid=str(d.get("device_uuid", "")),
        )


def cuda_uuid(device: torch.device) -> str:
    """The GPU's UUID, the same in every process whatever CUDA_VISIBLE_DEVICES numbers it."""
    return str(torch.cuda.get_device_properties(device).uuid)


class _Mapped:
    """The slots' memory: the nonce, then two slots of ``slot_bytes``."""

    offer: SlotsOffer
    memory: Tensor

    def slot(self, i: int) -> Tensor:
        start = _HEADER + (i % 2) * self.offer.slot_bytes
        return self.memory[start : start + self.offer.slot_bytes]

    @property
    def on_gpu(self) -> bool:
        return self.memory.is_cuda

    def synchronize(self) -> None:
        """Wait for this process's queued copies into or out of the slots (GPU memory)."""
        if self.memory.is_cuda:
            torch.cuda.current_stream(self.memory.device).synchronize()


class SharedSlots(_Mapped):
    """The trainer's end: creates the memory (host memory unless ``device`` is a GPU);
    ``close`` releases it (the workers' mappings stay valid until they drop them)."""

    def __init__(self, slot_bytes: int, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        slot_bytes = -(-max(slot_bytes, 8) // _ALIGN) * _ALIGN
        nonce = secrets.token_hex(16)
        self._fd: int | None = None
        if device.type == "cuda":
            size = _HEADER + 2 * slot_bytes
            self.memory = torch.empty(size, dtype=torch.uint8, device=device)
            self.memory[: len(nonce)] = _ascii(nonce).to(device)
            torch.cuda.current_stream(device).synchronize()
            ipc = self.memory.untyped_storage()._share_cuda_()
            self.offer = SlotsOffer(
                "cuda", nonce, slot_bytes, ipc=tuple(ipc), device_uuid=cuda_uuid(device)
            )
            return
        if not hasattr(os, "memfd_create"):
            raise OSError("shared weight slots need Linux (os.memfd_create)")
        fd = os.memfd_create("asyncrl-weights", os.MFD_CLOEXEC)
        try:
            self.offer = SlotsOffer("memfd", nonce, slot_bytes, pid=os.getpid(), fd=fd)
            os.ftruncate(fd, self.offer.nbytes)
            self.memory = torch.from_file(
                f"/proc/self/fd/{fd}", shared=True, size=self.offer.nbytes, dtype=torch.uint8
            )
        except Exception:
            os.close(fd)
            raise
        self.memory[: len(nonce)] = _ascii(nonce)
        self._fd = fd

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
        self.offer = offer
        if offer.kind == "cuda":
            self.memory = _open_cuda(offer)
            where = f"the CUDA IPC buffer on GPU {offer.device_uuid}"
        else:
            self.memory = torch.from_file(
                offer.path, shared=True, size=offer.nbytes, dtype=torch.uint8
            )
            where = offer.path
        found = bytes(self.memory[: len(offer.nonce)].cpu().tolist()).decode(errors="replace")
        if found != offer.nonce:
            raise OSError(f"{where} is not the trainer's weight memory (nonce mismatch)")


def _open_cuda(offer: SlotsOffer) -> Tensor:
    """The trainer's GPU buffer, opened in this process by its IPC handle."""
    device = local_cuda_device(offer.device_uuid)
    storage = open_cuda_storage(offer.ipc, device)
    memory = torch.empty(0, dtype=torch.uint8, device=device)
    memory.set_(storage, 0, (offer.nbytes,), (1,))
    return memory


def local_cuda_device(device_uuid: str) -> torch.device:
    """This process's device for the GPU of that UUID (numbers differ between processes)."""
    if not torch.cuda.is_available():
        raise OSError("CUDA weight memory offered, but this process has no GPU")
    local = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    device = next((d for d in local if cuda_uuid(d) == device_uuid), None)
    if device is None:
        raise OSError(f"the trainer's GPU {device_uuid} is not visible to this process")
    torch.cuda._lazy_init()
    return device


def open_cuda_storage(ipc: tuple[Any, ...] | list[Any], device: torch.device) -> Any:
    """A storage the trainer shared (the fields of its ``_share_cuda_``, bytes as hex), opened
    in this process on ``device``."""
    fields = [bytes.fromhex(v) if isinstance(v, str) else v for v in ipc]
    # _share_cuda_ gives (device index, handle, size, offset, ref counter handle, ref counter
    # offset, event handle, event sync required); the index is the trainer's numbering.
    fields[0] = device.index
    return torch.UntypedStorage._new_shared_cuda(*fields)


def _ascii(text: str) -> Tensor:
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
