"""The trainer's weights, read in place by the rollout workers on its host.

Why: the shared slots (``sync.shared_slots``) cost two copies of every byte, the trainer's
pack into a slot and the worker's copy out of it, plus a token and an acknowledgement per
bucket. On one GPU both copies are launch- and signal-bound (21 ms for a 0.5B model where one
device-to-device copy takes 0.7 ms: docs/benchmarks.md). Here the worker maps the memory the
trainer's weights live in and copies every tensor straight into its own (one multi-tensor copy,
cast to its dtype on the way), between one token ("the weights are final") and one
acknowledgement ("copied: you may step again").

Two kinds, as for the slots:

- ``direct_cuda``: weights on the trainer's GPU. Each storage is shared by its CUDA IPC handle
  (torch's ``_share_cuda_``, what ``torch.multiprocessing`` uses), as it is: nothing moves.
- ``direct_memfd``: weights in the trainer's host memory. Ordinary host memory cannot be
  mapped by another process, so the trainer's tensors are moved once into one anonymous
  shared file (``memfd``), each into pages of its own, and keep living there (``tensor.data``
  re-pointed, so the optimizer and the modules holding them see nothing change). Only tensors
  that own their whole storage are moved; a model with views into shared storages keeps the
  slots.

An offer names an *epoch*: the trainer makes a new one whenever its tensors moved (a new
storage, another shape), and a worker reads in place only under the epoch it mapped.
"""

from __future__ import annotations

import contextlib
import mmap
import operator
import os
import secrets
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from .buckets import TensorSpec
from .copy_plan import CopyPlan
from .shared_slots import cuda_uuid, local_cuda_device, open_cuda_storage

__all__ = ["DirectOffer", "DirectView", "ExposedWeights", "fingerprint", "placement"]

Kind = Literal["direct_memfd", "direct_cuda"]
_HEADER = 64  # bytes of the nonce's mark

_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
_DTYPES.update({str(d): d for d in (torch.int64, torch.int32, torch.int8, torch.uint8)})
_DTYPES.update({str(d): d for d in (torch.int16, torch.bool)})
_NBYTES = operator.attrgetter("nbytes")


def fingerprint(tensors: list[Tensor]) -> tuple:
    """Where and how each tensor lives: equal fingerprints, the same memory to read."""
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors)


def placement(tensors: list[Tensor]) -> tuple:
    """Where each tensor's bytes start and how many there are: what a transfer's cached
    plan depends on at each sync, at a third of ``fingerprint``'s cost (59 against 177 us
    for a 0.5B model's 291 tensors on the 2-core machine; numel and element size apart took
    20 us more). A tensor that moves or is resized changes it; one reshaped or recast in
    place at the same address and size does not (a model's weights never are: ``.to`` and
    ``flatten_parameters`` allocate anew)."""
    return tuple(map(Tensor.data_ptr, tensors)), tuple(map(_NBYTES, tensors))


@dataclass(frozen=True)
class DirectOffer:
    """What a worker needs to read the trainer's tensors (JSON on the pair, never pickled).

    ``tensors``: per manifest entry, in manifest order, (storage index, offset in elements,
    shape, stride, dtype) of the trainer's tensor (its own dtype: the worker casts).
    ``storages``: memfd: one, ``[pid, fd, nbytes]``; cuda: the fields of ``_share_cuda_`` of
    each storage (bytes as hex), the first the nonce's."""

    kind: Kind
    epoch: int
    nonce: str
    storages: tuple[Any, ...]
    tensors: tuple[Any, ...]
    device_uuid: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "epoch": self.epoch,
            "nonce": self.nonce,
            "storages": [[_hex(v) for v in s] for s in self.storages],
            "tensors": [list(t) for t in self.tensors],
            "device_uuid": self.device_uuid,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DirectOffer:
        kind = d.get("kind")
        if kind not in ("direct_memfd", "direct_cuda"):
            raise ValueError(f"unknown kind of in-place weights: {kind!r}")
        return cls(
            kind=kind,
            epoch=int(d["epoch"]),
            nonce=str(d["nonce"]),
            storages=tuple(tuple(s) for s in d["storages"]),
            tensors=tuple(tuple(t) for t in d["tensors"]),
            device_uuid=str(d.get("device_uuid", "")),
        )


class ExposedWeights:
    """The trainer's end: its tensors (manifest order) made readable by local workers.

    ``tensors`` maps every name to its tensor (aliases included), so that a host-memory move
    re-points every name of a tied group. Raises when the tensors cannot be shared; the caller
    then keeps the slots."""

    def __init__(
        self, manifest: list[TensorSpec], tensors: Mapping[str, Tensor], epoch: int
    ) -> None:
        primaries = [tensors[s.name] for s in manifest]
        devices = {t.device for t in primaries}
        if len(devices) != 1:
            raise ValueError(f"weights on several devices: {sorted(map(str, devices))}")
        device = devices.pop()
        nonce = secrets.token_hex(16)
        self._fd: int | None = None
        self._keep: list[Tensor] = []  # the memory shared: alive as long as offered
        if device.type == "cuda":
            self.offer = self._share_cuda(primaries, device, nonce, epoch)
        else:
            self.offer = self._move_to_memfd(manifest, tensors, nonce, epoch)
        self.fingerprint = fingerprint([tensors[s.name] for s in manifest])

    def _share_cuda(
        self, primaries: list[Tensor], device: torch.device, nonce: str, epoch: int
    ) -> DirectOffer:
        mark = torch.zeros(_HEADER, dtype=torch.uint8, device=device)
        mark[: len(nonce)] = torch.tensor(list(nonce.encode()), dtype=torch.uint8)
        torch.cuda.current_stream(device).synchronize()
        self._keep.append(mark)
        index: dict[int, int] = {}
        storages = [tuple(mark.untyped_storage()._share_cuda_())]
        entries = []
        for t in primaries:
            if t.numel() == 0:  # nothing to read (and no memory to share): a view of the mark
                entries.append((0, 0, list(t.shape), list(t.stride()), str(t.dtype)))
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in index:
                index[storage.data_ptr()] = len(storages)
                storages.append(tuple(storage._share_cuda_()))
            entries.append(_entry(index[storage.data_ptr()], t))
        return DirectOffer(
            "direct_cuda", epoch, nonce, tuple(storages), tuple(entries), cuda_uuid(device)
        )

    def _move_to_memfd(
        self, manifest: list[TensorSpec], tensors: Mapping[str, Tensor], nonce: str, epoch: int
    ) -> DirectOffer:
        """Move each tensor into a page of its own of one shared file. Each keeps a storage
        of its own (its own mapping): ``torch.save`` refuses tensors of several
        dtypes in one storage, safetensors tensors sharing one."""
        if not hasattr(os, "memfd_create"):
            raise OSError("weights read in place need Linux (os.memfd_create)")
        primaries = [tensors[s.name] for s in manifest]
        for spec, t in zip(manifest, primaries, strict=True):
            whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
            if not (t.is_contiguous() and t.storage_offset() == 0 and whole):
                raise ValueError(f"{spec.name} is a view into a larger storage")
        page = mmap.ALLOCATIONGRANULARITY
        offsets, total = [], page  # the first page holds the nonce
        for t in primaries:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // page) * page
        fd = os.memfd_create("asyncrl-weights-in-place", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, page, offset=0) as header:
                header[: len(nonce)] = nonce.encode()
            entries = []
            with torch.no_grad():
                for spec, t, offset in zip(manifest, primaries, offsets, strict=True):
                    nbytes = t.numel() * t.element_size()
                    entries.append(_entry(0, t, offset // t.element_size()))  # contiguous
                    if nbytes == 0:
                        continue
                    memory = mmap.mmap(fd, nbytes, offset=offset)
                    home = torch.frombuffer(memory, dtype=t.dtype, count=t.numel()).view(t.shape)
                    home.copy_(t)
                    for obj in {id(tensors[n]): tensors[n] for n in spec.names}.values():
                        obj.data = home  # the same object, now in shared memory
        except Exception:
            os.close(fd)
            raise
        self._fd = fd
        return DirectOffer(
            "direct_memfd", epoch, nonce, ((os.getpid(), fd, total),), tuple(entries)
        )

    def close(self) -> None:
        """Stop offering (the tensors moved to host memory stay where they are)."""
        self._keep = []
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class DirectView:
    """A worker's end: the trainer's tensors, mapped, and the copy into this worker's own."""

    def __init__(self, offer: DirectOffer) -> None:
        self.offer = offer
        if offer.kind == "direct_cuda":
            storages, mark, where = _open_cuda(offer)
        else:
            pid, fd, nbytes = offer.storages[0]
            where = f"/proc/{int(pid)}/fd/{int(fd)}"
            arena = torch.from_file(where, shared=True, size=int(nbytes), dtype=torch.uint8)
            storages, mark = [arena.untyped_storage()], arena[:_HEADER]
        found = bytes(mark[: len(offer.nonce)].cpu().tolist()).decode(errors="replace")
        if found != offer.nonce:
            raise OSError(f"{where} is not the trainer's weight memory (nonce mismatch)")
        device = mark.device
        self._plan: CopyPlan | None = None
        self._plan_key: Hashable = None
        self.sources: list[Tensor] = []
        for s, offset, shape, stride, dtype in offer.tensors:
            t = torch.empty(0, dtype=_DTYPES[dtype], device=device)
            self.sources.append(t.set_(storages[s], int(offset), tuple(shape), tuple(stride)))

    def copy_into(self, targets: list[list[Tensor]], key: Hashable = None) -> None:
        """Copy each trainer tensor into its targets (the worker's tensor, and any name tied
        to it that does not share its storage), casting to their dtype. ``key`` names the
        targets (the same key, the same tensors): their copy plan is then kept."""
        if (
            self._plan is None
            or key is None
            or (key is not self._plan_key and key != self._plan_key)
        ):
            pairs = [
                (t, source)
                for source, names in zip(self.sources, targets, strict=True)
                for t in names
            ]
            self._plan = CopyPlan(pairs, way=self._plan.way if self._plan else None)
            self._plan_key = key
        self._plan.run()

    def synchronize(self) -> None:
        """Wait for this process's queued copies out of the trainer's GPU memory."""
        if self._plan is not None:
            self._plan.synchronize()

    @property
    def copy_s(self) -> float | None:
        """Device time of the last copy (known after ``synchronize``)."""
        return self._plan.last_s if self._plan is not None else None

    @property
    def copy_way(self) -> str:
        """How the last copy went (``sync.copy_plan.WAYS``)."""
        return (self._plan.way or "") if self._plan is not None else ""


def _entry(storage: int, t: Tensor, offset: int | None = None) -> tuple[Any, ...]:
    """(storage index, offset in elements, shape, stride, dtype) of ``t``; ``offset``: where
    it lies in the shared file when that is not its own storage's offset."""
    start = t.storage_offset() if offset is None else offset
    return (storage, start, list(t.shape), list(t.stride()), str(t.dtype))


def _hex(v: Any) -> Any:
    return v.hex() if isinstance(v, bytes) else v


def _open_cuda(offer: DirectOffer) -> tuple[list[Any], Tensor, str]:
    """Each storage the trainer shared, opened in this process by its IPC handle."""
    device = local_cuda_device(offer.device_uuid)
    storages = [open_cuda_storage(raw, device) for raw in offer.storages]
    mark = torch.empty(0, dtype=torch.uint8, device=device).set_(storages[0], 0, (_HEADER,), (1,))
    return storages, mark, f"the CUDA IPC weights on GPU {offer.device_uuid}"
