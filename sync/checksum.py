"""A bit-for-bit fingerprint of a model's weights, to prove a sync delivered exactly them.

Two formats, told apart by their prefix; whoever checks computes in the format of the
checksum it compares with (``like=``), so both ends need not be on the same kind of device.

- ``sha256-tree:`` (weights on a CPU): sha256 over every byte, at roughly 1 GB/s on one core,
  so the bytes are hashed in pieces of ``CHUNK`` on a thread pool (hashlib lets go of the
  interpreter lock), one per core; below ``INLINE_BYTES`` on the calling thread (same digest).
- ``wsum64:`` (weights on a GPU): hashing there first copies every tensor to the host; on an
  H100 that, with sha256, cost a 0.36B model's sync ~0.3 s at the trainer and ~0.6 s at the
  worker, 30x the transfer itself. This one is computed where the tensors are: each tensor's
  bytes read as integer words ``w_i`` give ``sum_i w_i * m_i mod 2**64`` with odd multipliers
  ``m_i = 2 * i * MULT + 1``, then sha256 over the names, dtypes, shapes and those sums. A sum
  mod 2**64 comes out the same in any order, so a CPU and a GPU agree bit for bit; any single
  changed word changes it (m_i is odd); a few kernels per tensor (on a GPU, per piece of a
  flat model's buffer: ``_segment_word_sums``), no host copy. It guards against bugs (a lost,
  reordered or misplaced bucket), not against an adversary.

``sync.verify_checksum=false`` turns both off.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .buckets import TensorSpec, named_tensors, weight_manifest

__all__ = ["same_format", "weights_checksum"]

TREE = "sha256-tree:"
"""The prefix of the CPU format (module doc)."""
WSUM = "wsum64:"
"""The prefix of the on-device format (module doc)."""
CHUNK = 32 << 20
"""Bytes hashed as one piece."""
INLINE_BYTES = 8 << 20
"""Weights up to this size are hashed on the calling thread: starting a pool and handing it a
future per tensor cost more than the hashing (the demo policy's 1.3 MB: 2.3 ms through a pool,
0.9 ms inline, idle; 4-6 ms through a pool at a loaded trainer's sync, on its critical path)."""
MULT = 0x9E3779B97F4A7C15 - (1 << 64)
"""The index multiplier (2**64 / golden ratio, as a signed 64-bit integer)."""
PIECE = {"cpu": 1 << 18, "cuda": 1 << 22}
"""Words summed per pass, by device type: small pieces stay in a CPU's caches (1<<24 took 5x
longer at 0.5B on 2 cores); a GPU wants fewer, larger launches (32 MB of multipliers kept)."""
SEGMENTS = {"cpu": False, "cuda": True}
"""Whether the tensors of one buffer are summed as its segments (``_segment_word_sums``), by
device type: it saves a GPU most of its kernel launches; a CPU has none to save, and there
the running sums took 3x the tensor-by-tensor time (72 bf16 tensors, 2 cores)."""
WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The integer type a tensor's bytes are read as, by element size."""


def weights_checksum(
    model_or_state: nn.Module | Mapping[str, Tensor],
    like: str | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """``sha256-tree:<hex>``: sha256 over every tensor's names, dtype and shape and the sha256
    digests of its bytes' ``CHUNK``-sized pieces, in manifest order; or ``wsum64:<hex>`` (the
    module doc) where the weights are on a GPU.

    Tied tensors are hashed once (under all their names), so a model and its state dict, or
    the trainer's and a worker's copy, hash equal exactly when their bytes are equal. ``like``:
    a checksum recorded earlier (a step record a replay checks): computed in its format
    (ValueError for another). ``dtype``: of the floating-point weights cast
    to it, as a sync casting to the rollout's dtype delivers them (a bf16 worker's copy of
    float32 weights hashes equal to this).
    """
    tensors = named_tensors(model_or_state)
    specs = weight_manifest(tensors, dtype)
    if not like:
        on_gpu = any(t.is_cuda for t in tensors.values())
        like = WSUM if on_gpu else TREE
    if like.startswith(WSUM):
        return _word_sum_checksum(tensors, specs)
    if not like.startswith(TREE):
        raise ValueError(f"checksum {like[:24]!r}... is in no known format ({TREE}, {WSUM})")
    workers = os.cpu_count() or 1
    small = sum(spec.nbytes for spec in specs) <= INLINE_BYTES
    with _InlineExecutor() if small else ThreadPoolExecutor(max_workers=workers) as pool:
        pieces: list[list[Future[bytes]]] = []
        pending: deque[Future[bytes]] = deque()
        for spec in specs:
            raw = _raw(tensors[spec.name], spec.dtype) if spec.numel else None
            chunks = [] if raw is None else [raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)]
            pieces.append([pool.submit(_digest, c) for c in chunks])
            pending.extend(pieces[-1])
            while len(pending) > 4 * workers:  # host copies of GPU tensors wait in the queue
                pending.popleft().result()
        h = hashlib.sha256()
        for spec, futures in zip(specs, pieces, strict=True):
            h.update(f"{_header(spec)}\n".encode())
            for f in futures:
                h.update(f.result())
    return TREE + h.hexdigest()


class _InlineExecutor(Executor):
    """Runs each call at once on the calling thread (its future is done when returned)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def,unused-ignore]
        future: Future[bytes] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _header(spec: TensorSpec) -> str:
    """A tensor's line in every format: its names, dtype and shape."""
    return f"{'|'.join(spec.names)}:{spec.dtype}:{list(spec.shape)}"


def same_format(a: str, b: str) -> bool:
    """Whether two checksums are of one format (a worker that computed ``a`` ahead of the
    trainer's ``b`` computes again in ``b``'s if not)."""
    return _format(a) == _format(b)


def _format(checksum: str) -> str:
    return next((p for p in (TREE, WSUM) if checksum.startswith(p)), "")


def _word_sum_checksum(tensors: Mapping[str, Tensor], specs: list[TensorSpec]) -> str:
    values = _word_sums(tensors, specs)
    h = hashlib.sha256()
    for i, spec in enumerate(specs):
        h.update(f"{_header(spec)}:{values.get(i, 0)}\n".encode())
    return WSUM + h.hexdigest()


def _word_sums(tensors: Mapping[str, Tensor], specs: list[TensorSpec]) -> dict[int, int]:
    """Each non-empty spec's word sum, by its index: the tensors that lie in one buffer (a flat
    model's, ``asyncrl.models.flat``) as segments of it, the others one by one; one wait for
    each device at the end."""
    groups: dict[tuple[int, torch.device, torch.dtype, torch.dtype], list[int]] = {}
    for i, spec in enumerate(specs):
        t = tensors[spec.name]
        if spec.numel:
            whole = t.is_contiguous() and SEGMENTS.get(t.device.type, True)
            buffer = t.untyped_storage().data_ptr() if whole else -1 - i
            groups.setdefault((buffer, t.device, t.dtype, spec.dtype), []).append(i)
    by_device: dict[torch.device, tuple[list[int], list[Tensor]]] = {}
    for (_ptr, device, _dtype, dtype), members in groups.items():
        found = by_device.setdefault(device, ([], []))
        found[0].extend(members)
        views = [tensors[specs[i].name].detach() for i in members]
        if len(members) == 1:
            found[1].append(_word_sum(views[0].to(dtype)).reshape(1))
        else:
            found[1].append(_segment_word_sums(views, dtype))
    values: dict[int, int] = {}
    for members, sums in by_device.values():
        values.update(zip(members, torch.cat(sums).tolist(), strict=True))
    return values


def _word_sum(t: Tensor) -> Tensor:
    """``sum_i w_i * (2 * i * MULT + 1) mod 2**64`` over ``t``'s bytes read as integer words
    ``w_i`` (0-dim int64, on ``t``'s device; integer arithmetic wraps on CPUs and GPUs alike).

    Piece by piece: with ``base_j = 2 * j * MULT + 1``, the words ``start + j`` of a piece
    weigh ``base_j + 2 * start * MULT``, so a piece adds ``sum(w * base) + 2 * start * MULT *
    sum(w)``: one set of multipliers serves every piece."""
    words = t.contiguous().reshape(-1).view(WORDS[t.element_size()])
    piece_len = PIECE.get(t.device.type, PIECE["cuda"])
    base = _multipliers(piece_len, t.device)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), piece_len):
        piece = words[start : start + piece_len].to(torch.int64)
        total += piece.mul(base[: len(piece)]).sum()  # not in place: an int64 piece is t's own
        shift = _wrap(2 * start * MULT)
        if shift:
            total += piece.sum() * shift
    return total


def _segment_word_sums(views: list[Tensor], dtype: torch.dtype) -> Tensor:
    """``_word_sum`` of each of ``views`` (contiguous, all in one buffer), cast to ``dtype``,
    as one int64 tensor: a few kernels per piece of the buffer instead of a few per piece of
    each tensor (290 tensors at 0.5B: ~2,800 launches, 27-55 ms on an H200).

    A tensor at words ``[o, o + n)`` of the buffer sums ``w_k * (2 * (k - o) * MULT + 1)``; a
    piece starting at word ``p`` holds ``G_j = w_{p+j} * base_j`` and ``w_{p+j}``, whose running
    sums give any part ``[a, b)`` of a tensor in it: ``ΔG + 2 * (p - o) * MULT * Δw``. The running
    sums at the parts' ends are gathered piece by piece and combined once at the end."""
    first = views[0]
    offsets = [v.storage_offset() for v in views]
    ends = [o + v.numel() for o, v in zip(offsets, views, strict=True)]
    lo, hi = min(offsets), max(ends)
    buffer = first.as_strided((hi - lo,), (1,), lo)
    word = WORDS[dtype.itemsize]
    piece_len = PIECE.get(first.device.type, PIECE["cuda"])
    base = _multipliers(piece_len, first.device)
    plan = _segment_plan(tuple(offsets), tuple(ends), lo, hi, piece_len, first.device)
    run_g = torch.zeros(piece_len + 1, dtype=torch.int64, device=first.device)
    run_w = torch.zeros_like(run_g)  # [0] stays 0: the sum before a piece's first word
    ends_g = torch.empty_like(plan.at)
    ends_w = torch.empty_like(plan.at)
    for start, stop, first_at, last_at in plan.pieces:
        words = buffer[start - lo : stop - lo].to(dtype).view(word)
        n = stop - start
        torch.cumsum(words, 0, dtype=torch.int64, out=run_w[1 : n + 1])
        torch.cumsum(torch.mul(words, base[:n]), 0, out=run_g[1 : n + 1])
        index = plan.at[first_at:last_at]
        torch.index_select(run_g, 0, index, out=ends_g[first_at:last_at])
        torch.index_select(run_w, 0, index, out=ends_w[first_at:last_at])
    # each part's (end, start) pair: its sums, weighed by its shift, added to its tensor
    part_g = ends_g[0::2] - ends_g[1::2]
    part_w = ends_w[0::2] - ends_w[1::2]
    totals = torch.zeros(len(views), dtype=torch.int64, device=first.device)
    return totals.index_add_(0, plan.owner, part_g + part_w * plan.shift)


@dataclass(frozen=True)
class _SegmentPlan:
    """Where each tensor's parts lie in the pieces of a buffer (``_segment_word_sums``)."""

    pieces: list[tuple[int, int, int, int]]
    """Per piece ``(start, stop, first, last)``: its words, and its slice of ``at``."""
    at: Tensor
    """Each part's end and start within its piece, interleaved."""
    owner: Tensor
    """Each part's tensor (its index among the views)."""
    shift: Tensor
    """Each part's weight of its words' plain sum, ``2 * (piece start - tensor start) * MULT``."""


@functools.lru_cache(maxsize=8)
def _segment_plan(
    offsets: tuple[int, ...],
    ends: tuple[int, ...],
    lo: int,
    hi: int,
    piece_len: int,
    device: torch.device,
) -> _SegmentPlan:
    """The plan of a layout, on ``device`` (the same at every sync of a model: kept, so its
    copy to a GPU, which waits for the device, is made once)."""
    order = sorted(range(len(offsets)), key=offsets.__getitem__)
    pieces: list[tuple[int, int, int, int]] = []
    at: list[int] = []
    owner: list[int] = []
    shift: list[int] = []
    for start in range(lo, hi, piece_len):
        stop = min(start + piece_len, hi)
        first = len(at)
        for i in order:
            a, b = max(offsets[i], start), min(ends[i], stop)
            if a < b:
                at += [b - start, a - start]
                owner.append(i)
                shift.append(_wrap(2 * (start - offsets[i]) * MULT))
        if len(at) > first:
            pieces.append((start, stop, first, len(at)))
    as_int64 = functools.partial(torch.tensor, dtype=torch.int64, device=device)
    return _SegmentPlan(pieces, as_int64(at), as_int64(owner), as_int64(shift))


@functools.cache
def _multipliers(n: int, device: torch.device) -> Tensor:
    """``2 * j * MULT + 1 mod 2**64`` for ``j < n`` (int64, kept per device)."""
    return torch.arange(n, dtype=torch.int64, device=device).mul_(_wrap(2 * MULT)).add_(1)


def _wrap(x: int) -> int:
    """``x mod 2**64`` as a signed 64-bit integer (what torch's int64 arithmetic keeps)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _raw(t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``t``'s bytes (cast to ``dtype`` on its device first), on the CPU (uint8, flat)."""
    t = t.detach() if dtype is None else t.detach().to(dtype)
    return t.to("cpu").contiguous().reshape(-1).view(torch.uint8)


def _digest(raw: Tensor) -> bytes:
    return hashlib.sha256(memoryview(raw.numpy())).digest()  # type: ignore[arg-type]
