"""Many tensors copied at once from the trainer's memory into a worker's, the fastest way the
device offers, chosen by timing it there.

Why: on an H100 a worker's one multi-tensor copy (``torch._foreach_copy_``) of a 0.5B model's
290 bf16 tensors moved about 650 GB/s, half of what one plain device-to-device copy moves
(docs/benchmarks.md, "One H100", second run). Which way is fastest depends on the GPU, the
torch build and the model's shapes, so a worker on a GPU tries each way once, on the first
copy of a plan (every way copies the same bytes: each try is a real copy, the last one
stands), timed with CUDA events, and keeps the fastest. On a CPU there is one way.

The ways (each falls back to the first for the pairs it does not cover):

- ``foreach``: one multi-tensor copy of every pair, cast to the target's dtype.
- ``foreach_wide``: the pairs of one dtype (no cast), viewed as 8-byte words, so the
  multi-tensor kernel moves 4x the bytes per element it loads for bf16.
- ``large_apart``: the pairs of one dtype of at least ``LARGE_BYTES`` each by its own copy
  (a device-to-device memcpy for contiguous tensors), the small rest in one multi-tensor copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["LARGE_BYTES", "WAYS", "CopyPlan"]

log = logging.getLogger(__name__)

WAYS = ("foreach", "foreach_wide", "large_apart")
LARGE_BYTES = 1 << 20
"""The size from which ``large_apart`` gives a pair a copy of its own."""

_Lists = tuple[list[Tensor], list[Tensor]]


class CopyPlan:
    """The pairs (target, source) of one transfer, and how to copy them."""

    def __init__(self, pairs: Sequence[tuple[Tensor, Tensor]], way: str | None = None) -> None:
        if way is not None and way not in WAYS:
            raise ValueError(f"unknown way of copying {way!r} (one of {', '.join(WAYS)})")
        self.pairs = list(pairs)
        self.cuda = any(s.is_cuda for _, s in self.pairs)
        self.way = way or (None if self.cuda else "foreach")
        """The way the next copies take; None until a GPU's first copy chose it."""
        self.tried: dict[str, float] = {}
        """Seconds each way took on the copy that chose it (empty where none was timed)."""
        self.last_s: float | None = None
        """Device time of the last copy (after ``synchronize``)."""
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        self._runs: dict[str, Callable[[], None]] = {
            "foreach": self._foreach(self.pairs),
            "foreach_wide": self._wide(),
            "large_apart": self._large_apart(),
        }

    def run(self) -> None:
        """Copy every pair (queued on the current stream on a GPU: ``synchronize`` waits)."""
        with torch.no_grad():
            if self.way is None:
                self._choose()
                return
            if not self.cuda:
                t0 = time.perf_counter()
                self._runs[self.way]()
                self.last_s = time.perf_counter() - t0
                return
            start, end = self._events or _event_pair()
            self._events = (start, end)
            start.record()
            self._runs[self.way]()
            end.record()

    def synchronize(self) -> None:
        """Wait for the queued copies; ``last_s`` then holds their device time."""
        if self.cuda and self._events is not None:
            start, end = self._events
            end.synchronize()
            self.last_s = start.elapsed_time(end) / 1000

    def _choose(self) -> None:
        """Each way twice (the first run of a kernel pays for loading it), timed on the device;
        the fastest is kept. Every way writes the same bytes, so whichever ran last leaves the
        right weights."""
        timed = []
        for _ in range(2):
            for way in WAYS:
                start, end = _event_pair()
                start.record()
                self._runs[way]()
                end.record()
                timed.append((way, start, end))
        timed[-1][2].synchronize()
        self.tried = {}
        for way, start, end in timed:
            s = start.elapsed_time(end) / 1000
            self.tried[way] = min(s, self.tried.get(way, s))
        self.way = min(self.tried, key=self.tried.__getitem__)
        self.last_s = self.tried[self.way]
        self._events = None
        log.info(
            "in-place weight copy of %d tensors: %s (%s)",
            len(self.pairs),
            self.way,
            ", ".join(f"{w} {s * 1e3:.2f} ms" for w, s in self.tried.items()),
        )

    @staticmethod
    def _foreach(pairs: Sequence[tuple[Tensor, Tensor]]) -> Callable[[], None]:
        dst, src = [d for d, _ in pairs], [s for _, s in pairs]
        if not dst:
            return lambda: None
        return lambda: torch._foreach_copy_(dst, src)

    def _wide(self) -> Callable[[], None]:
        words: list[tuple[Tensor, Tensor]] = []
        rest: list[tuple[Tensor, Tensor]] = []
        for d, s in self.pairs:
            wide = _as_words(d, s)
            (rest if wide is None else words).append(wide or (d, s))
        return _both(self._foreach(words), self._foreach(rest))

    def _large_apart(self) -> Callable[[], None]:
        large = [(d, s) for d, s in self.pairs if _plain(d, s) and _nbytes(s) >= LARGE_BYTES]
        apart = {id(d) for d, _ in large}
        rest = self._foreach([(d, s) for d, s in self.pairs if id(d) not in apart])

        def run() -> None:
            for d, s in large:
                d.copy_(s)
            rest()

        return run


def _event_pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _both(a: Callable[[], None], b: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        a()
        b()

    return run


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _plain(d: Tensor, s: Tensor) -> bool:
    """A copy of bytes: one dtype, one shape, both contiguous."""
    return d.dtype == s.dtype and d.shape == s.shape and d.is_contiguous() and s.is_contiguous()


def _as_words(d: Tensor, s: Tensor) -> tuple[Tensor, Tensor] | None:
    """Both tensors as flat 8-byte words, where they are a plain copy of a whole number of
    8-byte-aligned words; else None."""
    if not _plain(d, s) or _nbytes(s) == 0 or _nbytes(s) % 8:
        return None
    if d.data_ptr() % 8 or s.data_ptr() % 8:
        return None
    try:
        return d.reshape(-1).view(torch.int64), s.reshape(-1).view(torch.int64)
    except RuntimeError:  # an offset torch will not reinterpret
        return None
