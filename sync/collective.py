"""The weight collective: the trainer sends its weights to each rollout worker over a pair group.

Why pairs, not one group of every process: a torch.distributed group has a fixed membership
formed once, so a worker that crashes and restarts (or one added mid-run) could never rejoin.
Here the trainer hosts a rendezvous store; each worker *incarnation* (one process lifetime,
named by a random id it announces in WorkerStarted) forms its own two-process group with the
trainer under a key of its own. A restart forms a new pair and receives the current weights
like a start-up; a dead worker's pair fails fast ("connection closed by peer") and is dropped,
without touching the others.

Joining, in order: the worker connects to the store and announces itself (WorkerStarted on
``control``, repeated every few seconds until answered, since the trainer may not be reading
yet); the trainer sets ``accept/<worker>/<incarnation>`` and builds its end of the pair; the
worker sees the key and builds its end.

A transfer first checks that both ends derived the same manifest and bucket plan (a 32-byte
digest plus the bucket size, all-gathered on the pair), so a mismatch is a clear error on both
sides rather than a hang or silently scrambled weights. Then each bucket is one broadcast per
pair, posted to every pair at once; the sender packs bucket i+1 while bucket i is on the wire
and the receiver unpacks bucket i while bucket i+1 arrives (two buffers each side). Buckets
holding a single contiguous tensor are sent and received in place, without packing.

A worker on the trainer's host (same host name and boot id, ``shared_memory`` on at both ends)
takes the weights from memory instead (``sync.shared_slots``): the trainer packs each bucket
into one of two slots it shares with every such worker, and the pair carries only a token per
bucket and the worker's acknowledgement that the slot may be refilled. One packed copy then
serves every local worker, and no byte crosses a socket. The medium is agreed per transfer in
the manifest exchange, so a worker that cannot map the memory keeps the collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .buckets import (
    Bucket,
    TensorSpec,
    manifest_diff,
    manifest_digest,
    named_tensors,
    pack,
    plan_buckets,
    unpack,
    untied_aliases,
    weight_manifest,
)
from .direct import DirectOffer, DirectView, ExposedWeights, fingerprint, placement
from .shared_slots import SharedSlots, SlotsOffer, SlotsView, host_id

__all__ = [
    "BroadcastResult",
    "ManifestMismatchError",
    "TransferStats",
    "WeightReceiver",
    "WeightSender",
]

log = logging.getLogger(__name__)

Backend = Literal["auto", "gloo", "nccl"]
_HEADER_BYTES = 32 + 8  # sha256 digest of the manifest + bucket_bytes as int64 little-endian
# (then each end's medium, JSON: its host, and the trainer's shared slots when it offers them)
_ANNOUNCE_EVERY_S = 2.0
_FULL = -1
"""A transfer's opening token when a manifest check comes first; an epoch (>= 0) instead
says the weights are final and readable in place under that epoch."""
AWAIT_SLICE_S = 0.5
"""How often a worker waiting for the trainer's opening looks up to poll its consumer group
(its max.poll.interval.ms is a few seconds: a worker that stops polling leaves the group)."""


class ManifestMismatchError(RuntimeError):
    """The trainer and a worker disagree on which tensors (or which buckets) to transfer."""


@dataclass
class TransferStats:
    """What one transfer moved (per receiver) and how long it took (digest check included)."""

    bytes: int
    seconds: float
    buckets: int
    tensors: int
    shared: int = 0
    """Workers that read the weights from the trainer's shared memory (the others got them
    over the collective)."""
    medium: str = "collective"
    """How the bytes moved: collective; memfd or cuda (the shared slots); direct_memfd or
    direct_cuda (the trainer's weights read in place): a worker's end, or the kinds its
    workers read, joined by + (the trainer's end)."""
    checked: bool = True
    """The manifest was checked in this transfer (every one but a worker's reads in place
    after the first of an epoch: a trainer's end, False when no worker needed it)."""
    copy_s: float | None = None
    """A worker's end, reading in place: the time of its copy alone (device time on a GPU),
    the rest of ``seconds`` being signals and waits."""
    copy_way: str = ""
    """A worker's end, reading in place: how it copied (``sync.copy_plan.WAYS``)."""
    waited_s: float = 0.0
    """A worker's end: of ``seconds``, the wait for the trainer to start the transfer (an
    in-flight update's receiving thread waits there for the trainer's next sync)."""

    @property
    def gbps(self) -> float:
        """Throughput in gigabytes (1e9 bytes) per second."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass
class BroadcastResult:
    """A send to several workers: who got the weights, and why the others did not."""

    stats: TransferStats
    delivered: dict[int, str] = field(default_factory=dict)
    """worker -> incarnation, for every pair that received every bucket."""
    failed: dict[int, str] = field(default_factory=dict)
    """worker -> error; these pairs are closed (the worker must join again)."""


def _resolve_backend(backend: Backend, device: torch.device) -> str:
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


@dataclass
class _Prepared:
    """One end's view of a transfer: its tensors by name, and what both ends derive from
    them (the manifest, the bucket plan, the manifest's digest)."""

    tensors: dict[str, Tensor]
    manifest: list[TensorSpec]
    buckets: list[Bucket]
    digest: str
    key: tuple = ()
    """The names and where their tensors live (``_prepare``'s cache key): equal keys, the
    same memory."""
    _kept: dict[str, list[list[Tensor]]] = field(default_factory=dict, repr=False)
    """Derived once per key: shared by the copies ``_prepare`` hands out for each transfer
    (``dataclasses.replace`` passes the same dict)."""

    def targets(self) -> list[list[Tensor]]:
        """Per manifest entry, the tensors a received value goes into: the entry's own, and
        each tied name that does not share its storage (an untied copy). Kept for the key
        (the same memory): a worker reading in place asks at every transfer, and building
        them took ~0.25 ms of a 0.5B handoff's ~1.7 ms on an H200."""
        if "targets" not in self._kept:
            self._kept["targets"] = [
                [self.tensors[spec.name], *untied_aliases(spec, self.tensors)]
                for spec in self.manifest
            ]
        return self._kept["targets"]


class _Pair:
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
        """Both ends on one host, the worker reading in place: a Unix socket that carries
        each transfer's opening number and the worker's acknowledgement (a gloo message over
        loopback took 0.1-0.5 ms to arrive on the 2-core machine, a Unix socket's round trip
        60 us). Set at both ends in the exchange where the worker maps the weights."""

    def broadcast(self, tensor: Tensor, root: int = 0) -> dist.Work:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return self.pg.broadcast([tensor], opts)

    def signal(self, root: int, value: int) -> tuple[dist.Work, Tensor]:
        """A one-number message from ``root`` (a bucket's token or its acknowledgement)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        return self.broadcast(t, root), t

    def open(self, value: int) -> None:
        """The trainer's opening number of a transfer (-1: a manifest check follows; an
        epoch: read the weights in place), on the fast channel where there is one."""
        if self.fast is not None:
            _send_number(self.fast, value, "the worker")
        else:
            self.signal(0, value)[0].wait()

    def take(self) -> int:
        """The worker's end of ``open``."""
        if self.fast is not None:
            return _recv_number(self.fast, "the trainer")
        work, token = self._opening or self.signal(0, _FULL)
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
            self._opening = self.signal(0, _FULL)
        work, last = self._opening[0], time.monotonic()
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.0005)  # a gloo pair crosses hosts: its transfer takes far longer
            if time.monotonic() - last >= AWAIT_SLICE_S:
                waiting()
                last = time.monotonic()

    def acknowledge(self, value: int) -> None:
        """The worker's word that it has read the epoch ``value`` (the trainer may step)."""
        if self.fast is not None:
            _send_number(self.fast, value, "the trainer")
        else:
            self.signal(1, value)[0].wait()

    def acknowledgement(self, value: int) -> Callable[[], None]:
        """The trainer's end of ``acknowledge``, posted now (after ``open``) and awaited by
        calling the result, which raises if the worker acknowledged another epoch."""
        fast = self.fast
        if fast is not None:
            return lambda: _check_ack(_recv_number(fast, "the worker"), value)
        work, got = self.signal(1, -1)

        def wait() -> None:
            work.wait()
            _check_ack(int(got.item()), value)

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


class _Endpoint:
    """What both ends share: backend, device, the two reusable byte buffers, manifest checks."""

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
        self.backend = _resolve_backend(backend, self.device)
        self.wire_device = self.device if self.backend == "nccl" else torch.device("cpu")
        """Where the collective's buffers live: gloo sends from host memory."""
        self.shared_memory = shared_memory
        self.master_addr = master_addr
        self.master_port = master_port
        self.timeout_s = timeout_s
        self._store: dist.TCPStore | None = None
        self._buffers: list[Tensor] = []
        self._prepared: dict[tuple, _Prepared] = {}

    def _prepare(
        self,
        model: nn.Module | Mapping[str, Tensor],
        bucket_bytes: int,
        dtype: torch.dtype | None = None,
    ) -> _Prepared:
        """The tensors to move, their manifest, bucket plan and digest. The last three are
        kept while the same names live in the same memory (recomputing them took ~1 ms a
        transfer at 0.5B, as long as the copy of the weights on a GPU)."""
        tensors = named_tensors(model)
        key = (int(bucket_bytes), dtype, tuple(tensors), placement(list(tensors.values())))
        kept = self._prepared.get(key)
        if kept is None:
            manifest = weight_manifest(tensors, dtype)
            buckets = plan_buckets(manifest, int(bucket_bytes))
            kept = _Prepared(tensors, manifest, buckets, manifest_digest(manifest), key)
            if len(self._prepared) >= 4:  # a worker alternates between two copies at most
                self._prepared.clear()
            self._prepared[key] = kept
        return dataclasses.replace(kept, tensors=tensors)

    def _verify_manifest(
        self,
        pair: _Pair,
        prep: _Prepared,
        bucket_bytes: int,
        worker: int,
        medium: dict[str, object],
    ) -> dict[str, object]:
        """Exchange (digest, bucket_bytes) on the pair, each end's ``medium`` after them; on
        a mismatch both ends raise. Returns the other end's medium."""
        manifest = prep.manifest
        header = bytes.fromhex(prep.digest) + int(bucket_bytes).to_bytes(8, "little")
        trainer_row, worker_row = pair.exchange(header + json.dumps(medium).encode())
        peer_row = worker_row if self.role == "trainer" else trainer_row
        if trainer_row[:_HEADER_BYTES] == worker_row[:_HEADER_BYTES]:
            peer = json.loads(peer_row[_HEADER_BYTES:] or b"{}")
            return peer if isinstance(peer, dict) else {}
        # Both ends saw the mismatch, so both join this second (rare) exchange of details.
        summary = json.dumps([(s.name, s.aliases, s.shape, str(s.dtype)) for s in manifest])
        a, b = pair.exchange(summary.encode())
        details = []
        sizes = (
            int.from_bytes(worker_row[32:_HEADER_BYTES], "little"),
            int.from_bytes(trainer_row[32:_HEADER_BYTES], "little"),
        )
        if sizes[0] != sizes[1]:
            details.append(f"worker {worker} uses bucket_bytes={sizes[0]}, trainer {sizes[1]}")
        trainer_rows, worker_rows = json.loads(a), json.loads(b)
        details.extend(manifest_diff(trainer_rows, worker_rows, worker))
        if {row[3] for row in trainer_rows} != {row[3] for row in worker_rows}:
            details.insert(
                0,
                "the dtypes differ: the trainer casts to actor_rollout_ref.rollout.dtype, which "
                "must resolve alike at both ends (set it explicitly rather than auto where the "
                "trainer's and the workers' hosts differ in having a GPU)",
            )
        raise ManifestMismatchError(
            f"weight manifest mismatch (this is the {self.role}); the trainer and worker "
            f"{worker} would transfer different tensors:\n  "
            + "\n  ".join(details[:20])
            + ("\n  ..." if len(details) > 20 else "")
        )

    def _ensure_buffers(self, buckets: list[Bucket], tensors: Mapping[str, Tensor]) -> list[Tensor]:
        """Two byte buffers big enough for the largest packed bucket, reused across syncs."""
        need = max((b.nbytes for b in buckets if self._direct(b, tensors) is None), default=0)
        if len(self._buffers) != 2 or self._buffers[0].numel() < need:
            self._buffers = [
                torch.empty(max(need, 8), dtype=torch.uint8, device=self.wire_device)
                for _ in range(2)
            ]
        return self._buffers

    def _direct(self, bucket: Bucket, tensors: Mapping[str, Tensor]) -> Tensor | None:
        """The tensor's own bytes when a one-tensor bucket can go on the wire without a copy."""
        if len(bucket.specs) != 1:
            return None
        t = tensors[bucket.specs[0].name]
        if t.device != self.wire_device or not t.is_contiguous() or t.numel() == 0:
            return None
        if t.dtype != bucket.dtype:  # cast while packing
            return None
        return t.detach().reshape(-1).view(torch.uint8)

    def _sync_device(self) -> None:
        """Wait for queued GPU work, so the stats time the transfer and not just its launch."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _rendezvous_error(self, what: str, err: Exception) -> RuntimeError:
        return RuntimeError(
            f"weight collective: {what} failed ({self.backend}, "
            f"{self.master_addr}:{self.master_port}, timeout {self.timeout_s:g} s): "
            f"{type(err).__name__}: {err}. Check that sync.master_addr/sync.master_port "
            "name the trainer's host and a port free there, the same for the trainer and "
            "every worker, and that the trainer is running (sync.timeout_s bounds the wait)."
        )


class WeightSender(_Endpoint):
    """The trainer's end: hosts the rendezvous store and one pair per joined worker."""

    role = "trainer"

    def __init__(
        self, *args, join_timeout_s: float = 10.0, in_place: bool = True, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.join_timeout_s = min(join_timeout_s, self.timeout_s)
        self.in_place = in_place
        """Offer local workers the weights to read in place (``sync.direct``); False: the
        slots only (``asyncrl bench sync`` measures both)."""
        self._exposed: ExposedWeights | None = None
        self._exposed_key: tuple = ()  # the _Prepared key the exposure was last checked under
        self._epoch = 0
        self._reads_in_place: dict[int, int] = {}  # worker -> the epoch it has mapped
        self._local_workers = False  # a worker on this host took part in a transfer
        self._pairs: dict[int, tuple[str, _Pair]] = {}
        self._slots: dict[str, SharedSlots] = {}
        self._gpu_workers = False  # a local worker on a GPU asked for slots in GPU memory
        self._failed_kinds: set[str] = set()
        self._listener: socket.socket | None = None  # the workers' fast channels connect here
        self._listener_name = ""
        self._unacked: list[tuple[int, _Pair, dist.Work, Tensor | None]] = []
        """The last transfer's final acknowledgements, awaited before the slots are written
        again (not before the transfer returns: the worker's own next exchange follows its
        copy anyway, but a transfer to other workers may come first)."""

    def start(self) -> None:
        """Listen on master_port (the workers connect to it)."""
        if self._store is not None:
            return
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            self._store = dist.TCPStore(
                self.master_addr,
                self.master_port,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=self.timeout_s),
            )
        except Exception as err:
            raise self._rendezvous_error("hosting the rendezvous store", err) from err

    @property
    def members(self) -> dict[int, str]:
        """worker -> incarnation of every connected worker."""
        return {w: inc for w, (inc, _) in self._pairs.items()}

    def connect(self, worker: int, incarnation: str) -> bool:
        """Accept a worker incarnation's announcement and build the pair; False if it never came.

        A previous incarnation of the same worker is dropped (it is dead: a live worker never
        announces twice with different ids).
        """
        if self._store is None:
            raise RuntimeError("WeightSender.start() must be called before connect()")
        if self._pairs.get(worker, ("", None))[0] == incarnation:
            return True
        self.disconnect(worker)
        key = f"{worker}/{incarnation}"
        self._store.set(f"accept/{key}", "1")
        try:
            pair = _Pair(
                self._store,
                key,
                0,
                self.backend,
                self.wire_device,
                self.join_timeout_s,
                self.timeout_s,
            )
        except Exception as err:
            log.warning("worker %d (%s) did not complete the join: %s", worker, incarnation, err)
            return False
        self._pairs[worker] = (incarnation, pair)
        return True

    def disconnect(self, worker: int) -> None:
        self._reads_in_place.pop(worker, None)
        entry = self._pairs.pop(worker, None)
        if entry is not None:
            entry[1].close()

    def broadcast(
        self,
        model: nn.Module | Mapping[str, Tensor],
        bucket_bytes: int,
        workers: Iterable[int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> BroadcastResult:
        """Send every weight of ``model`` to ``workers`` (default: every connected worker),
        floating-point ones cast to ``dtype`` while packing (the workers' dtype; None: as
        they are).

        A pair that fails (its worker died) is closed and reported, the others go on. A
        manifest mismatch is a configuration error and raises.
        """
        start = time.perf_counter()
        prep = self._prepare(model, bucket_bytes, dtype)
        tensors, manifest, buckets = prep.tensors, prep.manifest, prep.buckets
        self._settle_unacked()
        targets = (
            sorted(self._pairs) if workers is None else sorted(set(workers) & set(self._pairs))
        )
        exposed = self._expose(prep) if targets else None
        if exposed is not None:
            self._sync_device()  # final before any worker reads them in place
        live: dict[int, _Pair] = {}  # the pairs served bucket by bucket
        local: dict[int, str] = {}  # worker -> the kind of slots it reads
        in_place: dict[int, Callable[[], None]] = {}  # worker -> wait for its acknowledgement
        failed: dict[int, str] = {}

        def read_in_place(w: int, pair: _Pair) -> None:
            assert exposed is not None
            pair.open(exposed.offer.epoch)
            in_place[w] = pair.acknowledgement(exposed.offer.epoch)

        # A worker that reads this epoch of the weights in place needs no manifest check
        # (done when it mapped them): one token out, one acknowledgement back.
        full = []
        for w in targets:
            pair = self._pairs[w][1]
            if exposed is not None and self._reads_in_place.get(w) == exposed.offer.epoch:
                try:
                    read_in_place(w, pair)
                except Exception as err:
                    failed[w] = f"{type(err).__name__}: {err}"
            else:
                full.append(w)
        offered = self._offer(buckets) if full else {}
        medium: dict[str, object] = {"host": _host()}
        nonces = {k: v.offer.nonce for k, v in offered.items()}
        if full:  # the offers in JSON (~0.3 ms for 290 tensors): only for a manifest check
            medium.update({f"slots_{k}": slots.offer.as_json() for k, slots in offered.items()})
            if exposed is not None:
                medium["direct"] = exposed.offer.as_json()
                medium["signal"] = self._fast_listener()
        if exposed is not None:
            nonces[exposed.offer.kind] = exposed.offer.nonce
        for w in full:
            pair = self._pairs[w][1]
            try:
                pair.open(_FULL)
                peer = self._verify_manifest(pair, prep, bucket_bytes, w, medium)
                if peer.get("host") == _host():
                    self._local_workers = True
                    self._gpu_workers |= bool(peer.get("gpu"))
                    kind = _still_mapped(nonces, bool(peer.get("gpu")), peer.get("mapped", []))
                    if kind is None and nonces:  # the worker maps one kind, or none
                        kind, _, fast = pair.exchange(b"")[1].decode().partition(" ")
                        if fast:  # it connected its fast channel before replying
                            self._accept_fast(w, pair)
                    if exposed is not None and kind == exposed.offer.kind:
                        self._reads_in_place[w] = exposed.offer.epoch
                        read_in_place(w, pair)
                        continue
                    if kind in offered:
                        local[w] = kind
                live[w] = pair
            except ManifestMismatchError:
                raise
            except Exception as err:
                failed[w] = f"{type(err).__name__}: {err}"
        in_use = {kind: offered[kind] for kind in set(local.values())}
        host_slots = in_use.get("memfd")  # also the wire of the collective's pairs, if packed
        remote = any(w not in local for w in live)
        bufs = self._ensure_buffers(buckets, tensors) if remote and host_slots is None else []
        # per buffer slot: the works that must finish before it is refilled (the collective's
        # sends, the local workers' tokens and acknowledgements)
        # (worker, work, its tensor, whether it is an acknowledgement)
        pending: list[list[tuple[int, dist.Work, Tensor | None, bool]]] = [[], []]

        def settle(slot: int, defer_acks: bool = False) -> None:
            for w, work, signal, ack in pending[slot]:
                if defer_acks and ack and w in live:
                    self._unacked.append((w, live[w], work, signal))
                    continue
                try:
                    work.wait()
                except Exception as err:
                    failed[w] = f"{type(err).__name__}: {err}"
                    live.pop(w, None)
            pending[slot] = []

        served = False  # a bucket was packed or sent: this end's GPU work may be queued
        for i, bucket in enumerate(buckets):
            if not live:
                break
            served = True
            slot = i % 2
            settle(slot)  # this buffer was sent two buckets ago: free to refill
            for slots in in_use.values():
                if slots is not host_slots:  # GPU memory: packed on the GPU, then waited for
                    pack(bucket, tensors, out=_typed(slots.slot(i), bucket))
                    slots.synchronize()
            wire = None
            if host_slots is not None:  # packed once, for the local and the remote workers
                wire = pack(bucket, tensors, out=_typed(host_slots.slot(i), bucket))
            elif remote:
                wire = self._direct(bucket, tensors)
                if wire is None:
                    wire = pack(bucket, tensors, out=_typed(bufs[slot], bucket))
            for w, pair in list(live.items()):
                try:
                    if w in local:  # "bucket i is in its slot", then "slot read"
                        pending[slot].append((w, *pair.signal(0, i), False))
                        pending[slot].append((w, *pair.signal(1, i), True))
                    else:
                        assert wire is not None
                        pending[slot].append(
                            (w, pair.broadcast(wire.view(torch.uint8)), None, False)
                        )
                except Exception as err:
                    failed[w] = f"{type(err).__name__}: {err}"
                    live.pop(w)
        settle(0, defer_acks=True)
        settle(1, defer_acks=True)
        for w, acknowledged in in_place.items():  # the weights may change once these are back
            try:
                acknowledged()
                live[w] = self._pairs[w][1]
            except Exception as err:
                failed[w] = f"{type(err).__name__}: {err}"
        if served:  # read in place alone, nothing was queued here since the sync above
            self._sync_device()
        for w, why in failed.items():
            log.warning("weights not delivered to worker %d (pair closed): %s", w, why)
            self.disconnect(w)
        delivered = {w: self._pairs[w][0] for w in live if w in self._pairs}
        shared = len((set(local) | set(in_place)) & set(delivered))
        kinds = set(in_use) | ({exposed.offer.kind} if exposed is not None and in_place else set())
        how = "+".join(sorted(kinds)) or "collective"
        stats = _stats(start, manifest, len(buckets), shared, how, checked=bool(full))
        return BroadcastResult(stats, delivered, failed)

    def _settle_unacked(self) -> None:
        """Wait until the last transfer's local workers copied its final buckets out; a
        worker that died meanwhile is dropped (it will rejoin). Only its own pair: a new
        incarnation of the worker may have joined since, under the same worker id."""
        unacked, self._unacked = self._unacked, []
        for w, pair, work, _ in unacked:
            try:
                work.wait()
            except Exception as err:
                log.warning("worker %d did not acknowledge its last weights: %s", w, err)
                if w in self._pairs and self._pairs[w][1] is pair:
                    self.disconnect(w)

    def _expose(self, prep: _Prepared) -> ExposedWeights | None:
        """The weights offered to be read in place, once a worker on this host took part in
        a transfer; a new epoch when they moved since. None where they cannot be (off in the
        config, NCCL pairs, tensors that do not own their storage), and never again after
        that failed once."""
        if not (self.in_place and self.shared_memory and self._local_workers):
            return None
        if self.backend == "nccl" or "direct" in self._failed_kinds or not prep.manifest:
            return None
        if self._exposed is not None and self._exposed_key == prep.key:
            return self._exposed  # the same tensors in the same memory as last time
        current = fingerprint([prep.tensors[s.name] for s in prep.manifest])
        if self._exposed is not None and self._exposed.fingerprint == current:
            self._exposed_key = prep.key
            return self._exposed
        if self._exposed is not None:
            self._exposed.close()
            self._exposed = None
        try:
            self._epoch += 1
            self._exposed = ExposedWeights(prep.manifest, prep.tensors, self._epoch)
            self._exposed_key = ()  # host memory: the tensors have just moved
        except Exception as err:
            log.warning("the weights cannot be read in place (%s); shared slots instead", err)
            self._failed_kinds.add("direct")
        return self._exposed

    def _fast_listener(self) -> str:
        """The name of the Unix socket (Linux's abstract namespace) where workers reading in
        place connect their fast channel; "" where there is none (then gloo carries it)."""
        if self._listener is None and "fast" not in self._failed_kinds:
            name = f"asyncrl-weights-{secrets.token_hex(8)}"
            try:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind("\0" + name)
                listener.listen(64)
                listener.settimeout(self.join_timeout_s)
                self._listener, self._listener_name = listener, name
            except OSError as err:
                log.warning("no fast channel for in-place weights (%s); gloo carries it", err)
                self._failed_kinds.add("fast")
        return self._listener_name if self._listener is not None else ""

    def _accept_fast(self, worker: int, pair: _Pair) -> None:
        """The fast channel the worker connected before its reply (it now reads its
        openings there). Connections that introduce themselves as another pair are closed:
        a worker killed between connecting and replying leaves one behind, never accepted.
        Raises where the expected one does not come: the pair is then closed."""
        if self._listener is None:
            raise RuntimeError(f"worker {worker} connected a fast channel that was not offered")
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError as err:
                raise WeightChannelError(f"worker {worker}'s fast channel: {err}") from err
            conn.settimeout(pair.op_timeout_s)
            try:
                who = _recv_bytes(conn, _recv_number(conn, "a worker"), "a worker").decode()
            except Exception as err:
                conn.close()
                log.info("a stale fast channel closed (%s)", err)
                continue
            if who == pair.key:
                pair.attach_fast(conn)
                return
            conn.close()
            log.info("the fast channel of %s closed: it is not %s's", who, pair.key)

    def _offer(self, buckets: list[Bucket]) -> dict[str, SharedSlots]:
        """The shared slots to offer, by kind, grown to the largest bucket: host memory, and
        GPU memory once a local worker on a GPU asked (a trainer on a GPU). None where they
        cannot be (off in the config, NCCL pairs, not Linux), and a kind no more after it
        failed once."""
        if not self.shared_memory or self.backend == "nccl" or not buckets:
            return {}
        need = max(b.nbytes for b in buckets)
        kinds = {"memfd": torch.device("cpu")}
        if self._gpu_workers and self.device.type == "cuda":
            kinds["cuda"] = self.device
        for kind, device in kinds.items():
            slots = self._slots.get(kind)
            if (slots is not None and slots.fits(need)) or kind in self._failed_kinds:
                continue
            if slots is not None:
                slots.close()
            try:
                self._slots[kind] = SharedSlots(need, device)
            except Exception as err:
                log.warning("no shared weight slots in %s memory (%s)", kind, err)
                self._slots.pop(kind, None)
                self._failed_kinds.add(kind)
        return {k: v for k, v in self._slots.items() if k in kinds}

    def close(self) -> None:
        for w in list(self._pairs):
            self.disconnect(w)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._buffers = []
        for slots in self._slots.values():
            slots.close()
        self._slots = {}
        if self._exposed is not None:
            self._exposed.close()
            self._exposed = None
        self._store = None

    def __enter__(self) -> WeightSender:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WeightReceiver(_Endpoint):
    """A worker's end: one pair with the trainer for this process's lifetime."""

    role = "worker"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pair: _Pair | None = None
        self._view: SlotsView | None = None
        self._weights_view: DirectView | None = None
        self._direct_digest = ""  # the manifest checked when the weights were mapped in place
        self._failed_kinds: set[str] = set()
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
        (a stop is heard there); announcing at each check put two events a second on
        ``control`` for as long as no trainer came.
        """
        if self._pair is not None:
            return
        self.worker = worker
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        deadline = time.monotonic() + self.timeout_s
        # Until the trainer's store listens, in short tries with an announce between them, so
        # a worker told to stop is heard (one TCPStore connect retried for sync.timeout_s,
        # deaf to SIGTERM, and c10d logged a stack trace at each of its own tries).
        announced = -_ANNOUNCE_EVERY_S
        while not _listening(self.master_addr, self.master_port):
            if time.monotonic() > deadline:
                break  # the store's connect below fails and says so
            if time.monotonic() - announced >= _ANNOUNCE_EVERY_S or waiting is None:
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
            raise self._rendezvous_error("connecting to the trainer's store", err) from err
        key = f"{worker}/{incarnation}"
        while True:
            announce()
            try:
                store.wait([f"accept/{key}"], timedelta(seconds=_ANNOUNCE_EVERY_S))
                break
            except dist.DistNetworkError as err:  # the trainer's store is gone: it died
                raise ConnectionError(f"the trainer's store went away ({err})") from err
            except Exception as err:  # not accepted yet: announce again
                if time.monotonic() > deadline:
                    raise self._rendezvous_error(
                        f"worker {worker} waiting to be accepted by the trainer", err
                    ) from err
        try:
            self._pair = _Pair(
                store, key, 1, self.backend, self.wire_device, self.timeout_s, self.timeout_s
            )
        except Exception as err:
            raise self._rendezvous_error(f"worker {worker} forming its pair", err) from err

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
        prep = self._prepare(model, bucket_bytes)  # before the trainer's word: off its clock
        asked = time.perf_counter()
        opening = pair.take()
        waited = time.perf_counter() - asked
        stats = self._receive(pair, prep, bucket_bytes, opening, start)
        stats.waited_s = waited
        return stats

    def _receive(
        self, pair: _Pair, prep: _Prepared, bucket_bytes: int, opening: int, start: float
    ) -> TransferStats:
        """The transfer ``opening`` (the trainer's word) begins: in place, from the shared
        slots, or over the collective."""
        tensors, manifest, buckets = prep.tensors, prep.manifest, prep.buckets
        if opening != _FULL:
            return self._receive_in_place(pair, prep, opening, start, checked=False)
        gpu = self.device.type == "cuda"
        mapped = [v.offer.nonce for v in (self._view, self._weights_view) if v is not None]
        medium = {"host": _host(), "gpu": gpu, "mapped": mapped}
        peer = self._verify_manifest(pair, prep, bucket_bytes, self.worker, medium)
        offers = {k[6:]: v for k, v in peer.items() if k.startswith("slots_")}
        direct = peer.get("direct")
        if isinstance(direct, dict):
            offers[str(direct.get("kind"))] = direct
        if offers and peer.get("host") == _host():
            nonces = {k: v.get("nonce") for k, v in offers.items() if isinstance(v, dict)}
            kind = _still_mapped(nonces, gpu, mapped)
            if kind is None:  # a new offer: map it (or not) and say which
                kind = self._attach(offers)
                reply = kind
                signal = peer.get("signal")
                new_reader = kind.startswith("direct_") and pair.fast is None
                if new_reader and isinstance(signal, str) and self._connect_fast(pair, signal):
                    reply += " fast"
                pair.exchange(reply.encode())
            if kind.startswith("direct_") and self._weights_view is not None:
                self._direct_digest = prep.digest
                epoch = pair.take()
                return self._receive_in_place(pair, prep, epoch, start, checked=True)
            if kind in ("memfd", "cuda") and self._view is not None:
                return self._receive_shared(pair, self._view, prep, start)
        bufs = self._ensure_buffers(buckets, tensors)
        # posted[j] = (bucket, work, flat buffer to unpack or None when received in place)
        posted: list[tuple[Bucket, dist.Work, Tensor | None]] = []

        def post(i: int) -> None:
            bucket = buckets[i]
            wire = self._direct(bucket, tensors)
            flat = None
            if wire is None:
                flat = _typed(bufs[i % 2], bucket)
                wire = flat.view(torch.uint8)
            posted.append((bucket, pair.broadcast(wire), flat))

        if buckets:
            post(0)
        for i in range(len(buckets)):
            if i + 1 < len(buckets):
                post(i + 1)  # its buffer slot was released when bucket i-1 was unpacked
            bucket, work, flat = posted[i]
            work.wait()
            if flat is not None:
                unpack(bucket, flat, tensors)
        self._sync_device()
        return _stats(start, manifest, len(buckets))

    def _connect_fast(self, pair: _Pair, name: str) -> bool:
        """Connect this pair's fast channel to the trainer's socket ``name``, saying which
        worker this is; False (gloo carries the numbers) where that fails."""
        if not name:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(pair.op_timeout_s)
            sock.connect("\0" + name)
            hello = pair.key.encode()
            sock.sendall(_NUMBER.pack(len(hello)) + hello)
        except OSError as err:
            sock.close()
            log.warning("no fast channel to the trainer (%s); gloo carries it", err)
            return False
        pair.attach_fast(sock)
        return True

    def _attach(self, offers: dict[str, object]) -> str:
        """The kind of the trainer's memory this end reads, mapped once per offer: the
        weights in place, else slots; in GPU memory for weights on a GPU, else host memory.
        "none" (the collective) when this end has shared memory off or can map nothing. A
        kind that failed to map is not tried again."""
        if not self.shared_memory:
            return "none"
        for kind in _preferred_kinds(self.device.type == "cuda"):
            raw = offers.get(kind)
            if not isinstance(raw, dict) or kind in self._failed_kinds:
                continue
            try:
                if kind.startswith("direct_"):
                    direct = DirectOffer.from_json(raw)
                    if self._weights_view is None or self._weights_view.offer != direct:
                        self._weights_view = None
                        self._weights_view = DirectView(direct)
                else:
                    slots = SlotsOffer.from_json(raw)
                    if self._view is None or self._view.offer != slots:
                        self._view = None
                        self._view = SlotsView(slots)
                return kind
            except Exception as err:
                log.warning("cannot map the trainer's %s weight memory (%s)", kind, err)
                self._failed_kinds.add(kind)
        return "none"

    def _receive_in_place(
        self, pair: _Pair, prep: _Prepared, epoch: int, start: float, checked: bool
    ) -> TransferStats:
        """Copy the trainer's weights straight from its memory, then say so."""
        view = self._weights_view
        if view is None or view.offer.epoch != epoch:
            have = view.offer.epoch if view is not None else None
            raise RuntimeError(f"in-place weights out of step: epoch {epoch}, mapped {have}")
        if prep.digest != self._direct_digest:
            raise ManifestMismatchError(
                f"worker {self.worker} received into a model whose tensors differ from those "
                "it checked with the trainer when it mapped its weights"
            )
        view.copy_into(prep.targets(), key=prep.key)
        view.synchronize()  # copied before the trainer may step again
        if view.copy_s is None:  # untimed: the copy's end event did not wait for it
            self._sync_device()
        pair.acknowledge(epoch)
        stats = _stats(start, prep.manifest, 1, 1, view.offer.kind, checked)
        stats.copy_s, stats.copy_way = view.copy_s, view.copy_way
        return stats

    def _receive_shared(
        self,
        pair: _Pair,
        view: SlotsView,
        prep: _Prepared,
        start: float,
    ) -> TransferStats:
        """Each bucket from the slot the trainer's token names, acknowledged once copied."""
        tensors, buckets = prep.tensors, prep.buckets
        acks = []
        for i, bucket in enumerate(buckets):
            work, token = pair.signal(0, -1)
            work.wait()
            if int(token.item()) != i:
                raise RuntimeError(f"weight slots out of step: token {int(token)} for bucket {i}")
            unpack(bucket, _typed(view.slot(i), bucket), tensors)
            view.synchronize()  # copied out before the slot is handed back
            self._sync_device()
            acks.append(pair.signal(1, i))
        for work, _ in acks:
            work.wait()
        return _stats(start, prep.manifest, len(buckets), shared=1, medium=view.offer.kind)

    def close(self) -> None:
        self._view = None
        self._weights_view = None
        self._buffers = []
        if self._pair is not None:
            self._pair.close()
            self._pair = None


def _stats(
    start: float,
    manifest: list[TensorSpec],
    buckets: int,
    shared: int = 0,
    medium: str = "collective",
    checked: bool = True,
) -> TransferStats:
    return TransferStats(
        bytes=sum(s.nbytes for s in manifest),
        seconds=time.perf_counter() - start,
        buckets=buckets,
        tensors=len(manifest),
        shared=shared,
        medium=medium,
        checked=checked,
    )


_NUMBER = struct.Struct("<q")
"""A number on a pair's fast channel: an opening, an acknowledgement, the length of the
worker's introduction (its pair's key)."""


class WeightChannelError(RuntimeError):
    """A pair's fast channel failed (its peer died or closed it): a RuntimeError, as gloo's
    failures are, so a worker takes it for the trainer's death and joins the next one."""


def _send_number(sock: socket.socket, value: int, peer: str) -> None:
    try:
        sock.sendall(_NUMBER.pack(value))
    except OSError as err:
        raise WeightChannelError(f"the fast channel to {peer} failed: {err}") from err


def _check_ack(got: int, epoch: int) -> None:
    if got != epoch:
        raise RuntimeError(f"the worker acknowledged epoch {got}, not {epoch}")


def _recv_number(sock: socket.socket, peer: str) -> int:
    return int(_NUMBER.unpack(_recv_bytes(sock, _NUMBER.size, peer))[0])


def _recv_bytes(sock: socket.socket, n: int, peer: str) -> bytes:
    if not 0 <= n <= 4096:
        raise WeightChannelError(f"{peer} sent a length of {n} on the fast channel")
    data = b""
    try:
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise WeightChannelError(f"{peer} closed the fast channel")
            data += chunk
    except OSError as err:
        raise WeightChannelError(f"the fast channel to {peer} failed: {err}") from err
    return data


def _listening(host: str, port: int) -> bool:
    """Something accepts connections at ``host:port`` (the trainer's store, once it is up)."""
    try:
        with socket.create_connection((host, port), timeout=_ANNOUNCE_EVERY_S):
            return True
    except OSError:
        return False


@functools.cache
def _host() -> str:
    return host_id()


def _preferred_kinds(gpu: bool) -> tuple[str, ...]:
    """The kinds of the trainer's memory a worker reads, best first: its weights in place
    (one copy) before slots (two), GPU memory for weights on a GPU."""
    if gpu:
        return ("direct_cuda", "direct_memfd", "cuda", "memfd")
    return ("direct_memfd", "memfd")


def _still_mapped(nonces: Mapping[str, object], gpu: bool, mapped: object) -> str | None:
    """The kind a worker goes on reading without a word, both ends deciding alike: the kind
    it prefers among those offered, when it already maps that offer. None: it says which."""
    kind = next((k for k in _preferred_kinds(gpu) if k in nonces), None)
    if kind is None or not isinstance(mapped, Collection) or isinstance(mapped, str):
        return None
    return kind if nonces[kind] in mapped else None


def _typed(buf: Tensor, bucket: Bucket) -> Tensor:
    """The first ``bucket.nbytes`` of a byte buffer, viewed as the bucket's dtype."""
    return buf[: bucket.nbytes].view(bucket.dtype)
