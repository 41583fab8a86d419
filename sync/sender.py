"""The trainer's end of the weight collective: hosts the rendezvous store, one pair per joined
worker incarnation (``sync.rendezvous``), and a broadcast that hands each worker to one way of
moving the weights (``sync.transfers``).

A broadcast, in order:

1. prepare the manifest and bucket plan (``sync.manifest``), and wait for the last transfer's
   outstanding acknowledgements;
2. a worker that already reads this epoch of the weights in place gets the opening alone;
3. every other worker gets a manifest check, in which the medium is agreed
   (``sync.negotiation``): in place, the shared slots, or the bucketed collective;
4. the buckets go out to the ways that go by bucket (``sync.transfers.base.serve_buckets``);
5. the in-place readers' acknowledgements come back; a failed pair is closed and reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .direct import ExposedWeights
from .manifest import Prepared, PreparedCache, verify_manifest
from .negotiation import TrainerMemory
from .pair import FULL, Pair
from .rendezvous import Endpoint
from .results import BroadcastResult, ManifestMismatchError, transfer_stats
from .transfers.base import Transfer, serve_buckets
from .transfers.collective import Collective, WireBuffers
from .transfers.in_place import InPlace
from .transfers.slots import Slots

__all__ = ["WeightSender"]

log = logging.getLogger(__name__)


class WeightSender(Endpoint):
    """The trainer's end: hosts the rendezvous store and one pair per joined worker."""

    role = "trainer"

    def __init__(
        self, *args: Any, join_timeout_s: float = 10.0, in_place: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.join_timeout_s = min(join_timeout_s, self.timeout_s)
        self.in_place = in_place
        """Offer local workers the weights to read in place (``sync.direct``); False: the
        slots only (``asyncrl bench sync`` measures both)."""
        self.memory = TrainerMemory(
            self.device,
            usable=self.shared_memory and self.backend != "nccl",
            in_place=in_place,
            timeout_s=self.join_timeout_s,
        )
        self._prepared = PreparedCache()
        self._buffers = WireBuffers(self.wire_device)
        self._reads_in_place: dict[int, int] = {}  # worker -> the epoch it has mapped
        self._pairs: dict[int, tuple[str, Pair]] = {}
        self._unacked: list[tuple[int, Pair, dist.Work, Tensor | None]] = []
        """The last transfer's final acknowledgements, awaited before the slots are written
        again (not before the transfer returns: the worker's own next exchange follows its
        copy anyway, but a transfer to other workers may come first)."""

    def start(self) -> None:
        """Listen on master_port (the workers connect to it)."""
        if self._store is not None:
            return
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.host_store()

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
            pair = Pair(
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
        self.memory.usable = self.shared_memory and self.backend != "nccl"  # settable per call
        self.memory.in_place = self.in_place
        prep = self._prepared.prepare(model, bucket_bytes, dtype)  # step 1
        self._settle_unacked()
        targets = (
            sorted(self._pairs) if workers is None else sorted(set(workers) & set(self._pairs))
        )
        exposed = self.memory.expose(prep) if targets else None
        if exposed is not None:
            self.sync_device()  # final before any worker reads them in place
        failed: dict[int, str] = {}
        ways, checked = self._assign(prep, bucket_bytes, targets, exposed, failed)  # steps 2-3
        used = [w for w in ways if w.workers or (isinstance(w, InPlace) and w.asked)]
        served = serve_buckets(prep, ways, failed, self._unacked)  # step 4
        for way in ways:  # step 5
            way.finish(failed)
        if served:  # read in place alone, nothing was queued here since the sync above
            self.sync_device()
        for w, why in failed.items():
            log.warning("weights not delivered to worker %d (pair closed): %s", w, why)
            self.disconnect(w)
        reached = {w: way for way in ways for w in way.workers if w in self._pairs}
        delivered = {w: self._pairs[w][0] for w in sorted(reached)}
        shared = sum(1 for way in reached.values() if not isinstance(way, Collective))
        kinds = {way.kind for way in used if not isinstance(way, Collective)}
        how = "+".join(sorted(kinds)) or "collective"
        stats = transfer_stats(start, prep.manifest, len(prep.buckets), shared, how, checked)
        return BroadcastResult(stats, delivered, failed)

    def _assign(
        self,
        prep: Prepared,
        bucket_bytes: int,
        targets: list[int],
        exposed: ExposedWeights | None,
        failed: dict[int, str],
    ) -> tuple[list[Transfer], bool]:
        """Each target handed to the way it reads this transfer by, its opening sent (and
        its manifest checked where needed). Returns the ways, GPU slots before host slots
        before the collective (which reuses the host slots' packed bucket), and whether a
        manifest was checked."""
        in_place = InPlace(exposed) if exposed is not None else None
        full = []
        for w in targets:  # reads this epoch in place: no manifest check, one token out
            pair = self._pairs[w][1]
            if in_place is not None and self._reads_in_place.get(w) == in_place.exposed.offer.epoch:
                try:
                    in_place.add(w, pair)
                except Exception as err:
                    failed[w] = f"{type(err).__name__}: {err}"
            else:
                full.append(w)
        offered = self.memory.offer(prep.buckets) if full else {}
        slots = {kind: Slots(kind, offered[kind]) for kind in sorted(offered)}
        collective = Collective(self._buffers)
        nonces = {k: v.offer.nonce for k, v in offered.items()}
        if exposed is not None:
            nonces[exposed.offer.kind] = exposed.offer.nonce
        medium = self.memory.medium(offered, exposed) if full else {}
        for w in full:
            pair = self._pairs[w][1]
            try:
                pair.open(FULL)
                peer = verify_manifest(pair, prep, bucket_bytes, w, medium, self.role)
                kind = self.memory.choice(w, pair, peer, nonces)
                if in_place is not None and kind == in_place.kind:
                    self._reads_in_place[w] = in_place.exposed.offer.epoch
                    in_place.add(w, pair)
                else:
                    slots.get(kind, collective).add(w, pair)
            except ManifestMismatchError:
                raise
            except Exception as err:
                failed[w] = f"{type(err).__name__}: {err}"
        ways: list[Transfer] = [in_place] if in_place is not None else []
        return [*ways, *slots.values(), collective], bool(full)

    def _fast_listener(self) -> str:
        """The name of the socket local workers connect their fast channel to, listening
        from now on ("" where there is none)."""
        return self.memory.fast_listener()

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

    def close(self) -> None:
        for w in list(self._pairs):
            self.disconnect(w)
        self._buffers.clear()
        self.memory.close()
        self._store = None

    def __enter__(self) -> WeightSender:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
