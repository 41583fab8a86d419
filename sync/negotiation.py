"""Shared-memory negotiation: which medium each worker on the trainer's host reads a transfer
from, agreed inside the manifest exchange (``sync.manifest``).

A worker on the trainer's host (same host name and boot id, ``shared_memory`` on at both ends)
takes the weights from memory instead of the collective: the trainer's weights read in place
(``sync.direct``, one copy), else two bucket slots the trainer shares with every such worker
(``sync.shared_slots``, one packed copy serving every local worker). The trainer offers what it
can in its medium; a worker maps the kind it prefers and replies which (with " fast" when it
connected a fast channel, ``sync.fast_channel``). A worker that still maps the kind it would
choose says nothing: both ends decide alike (``still_mapped``). A worker that cannot map the
memory keeps the collective.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Mapping

import torch

from .buckets import Bucket
from .direct import DirectOffer, DirectView, ExposedWeights, fingerprint
from .fast_channel import FastListener, connect_fast
from .manifest import Prepared
from .pair import Pair
from .shared_slots import SharedSlots, SlotsOffer, SlotsView, host_id

__all__ = ["TrainerMemory", "WorkerMemory", "host", "preferred_kinds", "still_mapped"]

log = logging.getLogger(__name__)


@functools.cache
def host() -> str:
    return host_id()


def preferred_kinds(gpu: bool) -> tuple[str, ...]:
    """The kinds of the trainer's memory a worker reads, best first: its weights in place
    (one copy) before slots (two), GPU memory for weights on a GPU."""
    if gpu:
        return ("direct_cuda", "direct_memfd", "cuda", "memfd")
    return ("direct_memfd", "memfd")


def still_mapped(nonces: Mapping[str, object], gpu: bool, mapped: object) -> str | None:
    """The kind a worker goes on reading without a word, both ends deciding alike: the kind
    it prefers among those offered, when it already maps that offer. None: it says which."""
    kind = next((k for k in preferred_kinds(gpu) if k in nonces), None)
    if kind is None or not isinstance(mapped, Collection) or isinstance(mapped, str):
        return None
    return kind if nonces[kind] in mapped else None


class TrainerMemory:
    """The trainer's end: the memory it offers local workers, and their replies."""

    def __init__(
        self,
        device: torch.device,
        usable: bool,
        in_place: bool,
        timeout_s: float,
    ) -> None:
        self.device = device
        self.usable = usable
        """Shared memory on in the config, and pairs that can carry its tokens (not NCCL)."""
        self.in_place = in_place
        self.timeout_s = timeout_s
        self.local_workers = False
        """A worker on this host took part in a transfer."""
        self.gpu_workers = False
        """A local worker on a GPU asked for slots in GPU memory."""
        self._exposed: ExposedWeights | None = None
        self._exposed_key: tuple = ()  # the Prepared key the exposure was last checked under
        self._epoch = 0
        self._slots: dict[str, SharedSlots] = {}
        self._listener: FastListener | None = None
        self._failed_kinds: set[str] = set()

    def expose(self, prep: Prepared) -> ExposedWeights | None:
        """The weights offered to be read in place, once a worker on this host took part in
        a transfer; a new epoch when they moved since. None where they cannot be (off in the
        config, NCCL pairs, tensors that do not own their storage), and never again after
        that failed once."""
        if not (self.in_place and self.usable and self.local_workers):
            return None
        if "direct" in self._failed_kinds or not prep.manifest:
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

    def offer(self, buckets: list[Bucket]) -> dict[str, SharedSlots]:
        """The shared slots to offer, by kind, grown to the largest bucket: host memory, and
        GPU memory once a local worker on a GPU asked (a trainer on a GPU). None where they
        cannot be (off in the config, NCCL pairs, not Linux), and a kind no more after it
        failed once."""
        if not self.usable or not buckets:
            return {}
        need = max(b.nbytes for b in buckets)
        kinds = {"memfd": torch.device("cpu")}
        if self.gpu_workers and self.device.type == "cuda":
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

    def medium(
        self, offered: Mapping[str, SharedSlots], exposed: ExposedWeights | None
    ) -> dict[str, object]:
        """This end's medium for a manifest check: its host and its offers in JSON (~0.3 ms
        for 290 tensors, so only built when a worker needs a check)."""
        medium: dict[str, object] = {"host": host()}
        medium.update({f"slots_{k}": slots.offer.as_json() for k, slots in offered.items()})
        if exposed is not None:
            medium["direct"] = exposed.offer.as_json()
            medium["signal"] = self.fast_listener()
        return medium

    def choice(self, worker: int, pair: Pair, peer: Mapping[str, object], nonces: dict) -> str:
        """The kind of memory a checked worker reads (``nonces``: kind -> the nonce of each
        offer), "" for the collective: a worker elsewhere, or one that maps nothing."""
        if peer.get("host") != host():
            return ""
        self.local_workers = True
        self.gpu_workers |= bool(peer.get("gpu"))
        kind = still_mapped(nonces, bool(peer.get("gpu")), peer.get("mapped", []))
        if kind is None and nonces:  # the worker maps one kind, or none
            kind, _, fast = pair.exchange(b"")[1].decode().partition(" ")
            if fast:  # it connected its fast channel before replying
                self._accept_fast(worker, pair)
        return kind or ""

    def fast_listener(self) -> str:
        """The name of the socket where workers reading in place connect their fast
        channel; "" where there is none (then gloo carries it)."""
        if self._listener is None and "fast" not in self._failed_kinds:
            try:
                self._listener = FastListener(self.timeout_s)
            except OSError as err:
                log.warning("no fast channel for in-place weights (%s); gloo carries it", err)
                self._failed_kinds.add("fast")
        return self._listener.name if self._listener is not None else ""

    def _accept_fast(self, worker: int, pair: Pair) -> None:
        """The fast channel the worker connected before its reply (it now reads its
        openings there). Raises where it does not come: the pair is then closed."""
        if self._listener is None:
            raise RuntimeError(f"worker {worker} connected a fast channel that was not offered")
        pair.attach_fast(self._listener.accept(pair.key, worker, pair.op_timeout_s))

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for slots in self._slots.values():
            slots.close()
        self._slots = {}
        if self._exposed is not None:
            self._exposed.close()
            self._exposed = None


class WorkerMemory:
    """A worker's end: the trainer's memory it maps, kept from one transfer to the next."""

    def __init__(self, gpu: bool, enabled: bool) -> None:
        self.gpu = gpu
        self.enabled = enabled
        """``shared_memory`` on at this end."""
        self.slots: SlotsView | None = None
        self.weights: DirectView | None = None
        self.checked_digest = ""
        """The manifest checked when the weights were mapped in place."""
        self._failed_kinds: set[str] = set()

    def medium(self) -> dict[str, object]:
        """This end's medium for a manifest check: its host, device and what it maps."""
        mapped = [v.offer.nonce for v in (self.slots, self.weights) if v is not None]
        return {"host": host(), "gpu": self.gpu, "mapped": mapped}

    def choose(self, pair: Pair, peer: Mapping[str, object], medium: Mapping[str, object]) -> str:
        """The kind this end reads the transfer from, "" for the collective; a new choice
        is said to the trainer (with its fast channel connected first, reading in place)."""
        offers = {k[6:]: v for k, v in peer.items() if k.startswith("slots_")}
        direct = peer.get("direct")
        if isinstance(direct, dict):
            offers[str(direct.get("kind"))] = direct
        if not offers or peer.get("host") != host():
            return ""
        nonces = {k: v.get("nonce") for k, v in offers.items() if isinstance(v, dict)}
        kind = still_mapped(nonces, self.gpu, medium["mapped"])
        if kind is None:  # a new offer: map it (or not) and say which
            kind = self._attach(offers)
            reply = kind
            signal = peer.get("signal")
            if kind.startswith("direct_") and pair.fast is None and isinstance(signal, str):
                sock = connect_fast(signal, pair.key, pair.op_timeout_s)
                if sock is not None:
                    pair.attach_fast(sock)
                    reply += " fast"
            pair.exchange(reply.encode())
        if kind.startswith("direct_"):
            return kind if self.weights is not None else ""
        if kind in ("memfd", "cuda"):
            return kind if self.slots is not None else ""
        return ""

    def _attach(self, offers: dict[str, object]) -> str:
        """The kind of the trainer's memory this end reads, mapped once per offer: the
        weights in place, else slots; in GPU memory for weights on a GPU, else host memory.
        "none" (the collective) when this end has shared memory off or can map nothing. A
        kind that failed to map is not tried again."""
        if not self.enabled:
            return "none"
        for kind in preferred_kinds(self.gpu):
            raw = offers.get(kind)
            if not isinstance(raw, dict) or kind in self._failed_kinds:
                continue
            try:
                if kind.startswith("direct_"):
                    direct = DirectOffer.from_json(raw)
                    if self.weights is None or self.weights.offer != direct:
                        self.weights = None
                        self.weights = DirectView(direct)
                else:
                    slots = SlotsOffer.from_json(raw)
                    if self.slots is None or self.slots.offer != slots:
                        self.slots = None
                        self.slots = SlotsView(slots)
                return kind
            except Exception as err:
                log.warning("cannot map the trainer's %s weight memory (%s)", kind, err)
                self._failed_kinds.add(kind)
        return "none"

    def close(self) -> None:
        self.slots = None
        self.weights = None
