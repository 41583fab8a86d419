"""Many tensors copied at once from the trainer's memory into a worker's, the fastest way the
device offers, chosen by timing it there.

Why: on an H100 a worker's one multi-tensor copy (``torch._foreach_copy_``) of a 0.5B model's
290 bf16 tensors moved about 650 GB/s, half of what one plain device-to-device copy moves
(docs/benchmarks-archive.md, "One H100 (2026-11-24, second run)"). Which way is fastest
depends on the GPU, the
torch build and the model's shapes, so a worker on a GPU tries each way twice, on the first
copy of a plan (every way copies the same bytes: each try is a real copy), timed with CUDA
events, keeps the fastest and copies once more with it. On a CPU there is one way.

The ways (each falls back to the first for the pairs it does not cover):

- ``foreach``: one multi-tensor copy of every pair, cast to the target's dtype.
- ``foreach_wide``: the pairs of one dtype (no cast), viewed as 8-byte words, so the
  multi-tensor kernel moves 4x the bytes per element it loads for bf16.
- ``large_apart``: the contiguous pairs of at least ``LARGE_BYTES`` each by its own copy (a
  device-to-device memcpy where the dtypes match, one cast kernel where they do not: a float32
  trainer's weights into bf16 workers), the small rest in one multi-tensor copy.

Before any way, pairs that lie back to back in memory at both ends (the tensors of
:func:`asyncrl.models.flat.flatten_parameters`' one buffer per dtype, which both roles use on a
GPU) are merged into one pair (:func:`coalesce`): a whole model is then one copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["LARGE_BYTES", "WAYS", "CopyPlan", "coalesce"]

log = logging.getLogger(__name__)

WAYS = ("foreach", "foreach_wide", "large_apart")
LARGE_BYTES = 1 << 20
"""The size from which ``large_apart`` gives a pair a copy of its own."""


class CopyPlan:
    """The pairs (target, source) of one transfer, and how to copy them."""

    def __init__(
        self,
        pairs: Sequence[tuple[Tensor, Tensor]],
        way: str | None = None,
        choose: bool | None = None,
    ) -> None:
        """``way``: the way to copy (a GPU's earlier choice); else the first copy chooses
        where ``choose`` (default: on a GPU), and takes ``foreach`` where not."""
        if way is not None and way not in WAYS:
            raise ValueError(f"unknown way of copying {way!r} (one of {', '.join(WAYS)})")
        self.tensors = len(pairs)
        """Pairs asked for; ``pairs`` holds them merged where they lie back to back."""
        self.pairs = coalesce(pairs)
        self.cuda = any(s.is_cuda for _, s in self.pairs)
        if choose is None:
            choose = self.cuda
        self.way = way or (None if choose else "foreach")
        """The way the next copies take; None until the first copy chose it."""
        self.tried: dict[str, float] = {}
        """Seconds each way took on the copy that chose it (empty where none was timed)."""
        self.last_s: float | None = None
        """Time of the last copy (device time on a GPU, known after ``synchronize``)."""
        self._timer: _Timer | None = None
        self._runs: dict[str, Callable[[], None]] = {
            "foreach": self._foreach(self.pairs),
            "foreach_wide": self._wide(),
            "large_apart": self._large_apart(),
        }

    def run(self) -> None:
        """Copy every pair (queued on the current stream on a GPU: ``synchronize`` waits)."""
        with torch.no_grad():
            way = self.way or self._choose()
            # the chosen way raises rather than return None; its timer's events are made once
            self._timer = self._timed(way, self._timer)

    def synchronize(self) -> None:
        """Wait for the queued copies; ``last_s`` then holds their time."""
        if self._timer is not None:
            self.last_s = self._timer.seconds()

    def _timed(self, way: str, reuse: _Timer | None = None) -> _Timer | None:
        """Run ``way`` between two marks of time (``reuse``'s events, restarted, where given:
        making two CUDA events took a tenth of a 0.5B handoff's copy); None where it raised."""
        timer = reuse.restart() if reuse is not None else _Timer(self.cuda)
        try:
            self._runs[way]()
        except RuntimeError as err:
            if self.way is not None:
                raise  # the chosen way: nothing else to fall back to
            log.warning("in-place weight copy: %s failed (%s); not used", way, err)
            return None
        timer.stop()
        return timer

    def _choose(self) -> str:
        """Each way twice (the first run of a kernel pays for loading it); the fastest is
        kept and ``run`` copies once more with it, so the weights are its bytes whatever a
        way that failed left. A way that raises is dropped."""
        timed: list[tuple[str, _Timer]] = []
        failed: set[str] = set()
        for _ in range(2):
            for way in WAYS:
                if way not in failed:
                    timer = self._timed(way)
                    if timer is None:
                        failed.add(way)
                    else:
                        timed.append((way, timer))
        if len(failed) == len(WAYS):
            raise RuntimeError("no way of copying the weights in place worked")
        for way, timer in timed:
            if way not in failed:
                s = timer.seconds()
                self.tried[way] = min(s, self.tried.get(way, s))
        self.way = min(self.tried, key=self.tried.__getitem__)
        log.info(
            "in-place weight copy of %d tensors: %s (%s)",
            len(self.pairs),
            self.way,
            ", ".join(f"{w} {s * 1e3:.2f} ms" for w, s in self.tried.items()),
        )
        return self.way

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
        large = [(d, s) for d, s in self.pairs if _dense(d, s) and _nbytes(s) >= LARGE_BYTES]
        apart = {id(d) for d, _ in large}
        rest = self._foreach([(d, s) for d, s in self.pairs if id(d) not in apart])

        def run() -> None:
            for d, s in large:
                d.copy_(s)
            rest()

        return run


class _Timer:
    """A copy's time: CUDA events on a GPU (its queued work), the clock on a CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if cuda:
            self._start, self._end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self._start.record()
        self._t0 = time.perf_counter()
        self._s: float | None = None

    def restart(self) -> _Timer:
        """Time anew with the same events (the last time was read, or is not wanted)."""
        if self.cuda:
            self._start.record()
        self._t0 = time.perf_counter()
        self._s = None
        return self

    def stop(self) -> None:
        if self.cuda:
            self._end.record()
        else:
            self._s = time.perf_counter() - self._t0

    def seconds(self) -> float:
        """Waits for the copy on a GPU."""
        if self._s is None:
            self._end.synchronize()
            self._s = self._start.elapsed_time(self._end) / 1000
        return self._s


def coalesce(pairs: Sequence[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    """``pairs`` with each run of consecutive pairs that lie back to back at both ends (each
    end one storage and one dtype, every tensor contiguous, the next one starting where the
    last ended) merged into one pair of flat views over the run; the others as they are.

    The pairs are taken in the order of their targets in memory (a manifest lists names
    sorted, a flat model lays them out in its own order): each target is written once, so the
    order of the copies does not matter. Only exact adjacency merges: a gap between two
    tensors may hold memory of someone else's, which a merged copy would overwrite."""
    out: list[tuple[Tensor, Tensor]] = []
    run: list[tuple[Tensor, Tensor]] = []
    pairs = sorted(pairs, key=lambda p: (p[0].untyped_storage().data_ptr(), p[0].storage_offset()))

    def flush() -> None:
        if len(run) > 1:
            out.append(
                (_span(run[0][0], [d for d, _ in run]), _span(run[0][1], [s for _, s in run]))
            )
        else:
            out.extend(run)
        run.clear()

    for d, s in pairs:
        if not (_dense(d, s) and d.numel()):
            flush()
            out.append((d, s))
            continue
        if run and not (_follows(run[-1][0], d) and _follows(run[-1][1], s)):
            flush()
        run.append((d, s))
    flush()
    return out


def _follows(prev: Tensor, t: Tensor) -> bool:
    """``t`` starts where ``prev`` ends, in the same storage, with the same dtype."""
    return (
        t.dtype == prev.dtype
        and t.device == prev.device
        and t.untyped_storage().data_ptr() == prev.untyped_storage().data_ptr()
        and t.storage_offset() == prev.storage_offset() + prev.numel()
    )


def _span(first: Tensor, run: list[Tensor]) -> Tensor:
    """One flat view over the tensors of ``run`` (back to back from ``first``)."""
    n = sum(t.numel() for t in run)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (n,), (1,))


def _both(a: Callable[[], None], b: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        a()
        b()

    return run


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _dense(d: Tensor, s: Tensor) -> bool:
    """One shape, both contiguous: a copy (or a cast) element for element in memory order."""
    return d.shape == s.shape and d.is_contiguous() and s.is_contiguous()


def _plain(d: Tensor, s: Tensor) -> bool:
    """A copy of bytes: ``_dense`` and one dtype."""
    return d.dtype == s.dtype and _dense(d, s)


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
