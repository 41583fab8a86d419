"""In place: a worker on the trainer's host copies the trainer's weights straight from the
memory they live in (``sync.direct``), between one opening ("the weights are final, epoch e")
and one acknowledgement ("copied: you may step again"). The manifest is checked once, when the
worker maps an epoch's weights; later transfers of that epoch skip it."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..buckets import Bucket
from ..direct import DirectView, ExposedWeights
from ..manifest import Prepared
from ..pair import Pair
from ..results import ManifestMismatchError, TransferStats, transfer_stats
from .base import Message

__all__ = ["InPlace", "receive"]


class InPlace:
    """The trainer's end: the opening sent when a worker is added, its acknowledgement
    awaited at ``finish`` (the weights may change once it is back)."""

    by_bucket = False

    def __init__(self, exposed: ExposedWeights) -> None:
        self.exposed = exposed
        self.kind: str = exposed.offer.kind
        self.workers: dict[int, Pair] = {}
        self._acks: dict[int, tuple[Pair, Callable[[], None]]] = {}

    def add(self, worker: int, pair: Pair) -> None:
        pair.open(self.exposed.offer.epoch)
        self._acks[worker] = (pair, pair.acknowledgement(self.exposed.offer.epoch))

    def stage(
        self, i: int, bucket: Bucket, prep: Prepared, host_copy: Tensor | None
    ) -> Tensor | None:
        return host_copy

    def post(self, i: int, pair: Pair) -> list[Message]:
        return []

    def finish(self, failed: dict[int, str]) -> None:
        for w, (pair, acknowledged) in self._acks.items():
            try:
                acknowledged()
                self.workers[w] = pair
            except Exception as err:
                failed[w] = f"{type(err).__name__}: {err}"

    @property
    def asked(self) -> bool:
        """A worker was sent the opening in this broadcast."""
        return bool(self._acks)


def receive(
    pair: Pair,
    view: DirectView | None,
    prep: Prepared,
    epoch: int,
    checked_digest: str,
    worker: int,
    sync_device: Callable[[], None],
    start: float,
    checked: bool,
) -> TransferStats:
    """The worker's end: copy the trainer's weights straight from its memory, then say so.
    ``checked_digest``: the manifest checked when this epoch's weights were mapped."""
    if view is None or view.offer.epoch != epoch:
        have = view.offer.epoch if view is not None else None
        raise RuntimeError(f"in-place weights out of step: epoch {epoch}, mapped {have}")
    if prep.digest != checked_digest:
        raise ManifestMismatchError(
            f"worker {worker} received into a model whose tensors differ from those "
            "it checked with the trainer when it mapped its weights"
        )
    view.copy_into(prep.targets(), key=prep.key)
    view.synchronize()  # copied before the trainer may step again
    if view.copy_s is None:  # untimed: the copy's end event did not wait for it
        sync_device()
    pair.acknowledge(epoch)
    stats = transfer_stats(start, prep.manifest, 1, 1, view.offer.kind, checked)
    stats.copy_s, stats.copy_way = view.copy_s, view.copy_way
    return stats
