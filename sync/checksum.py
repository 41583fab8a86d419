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
  changed word changes it (m_i is odd); a few kernels per tensor, no host copy. It guards
  against bugs (a lost, reordered or misplaced bucket), not against an adversary.

``sync.verify_checksum=false`` turns both off.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import torch
from torch import Tensor, nn

from .buckets import TensorSpec, named_tensors, weight_manifest

__all__ = ["same_format", "weights_checksum"]

TREE = "sha256-tree:"
"""The prefix of the CPU format (module doc); a plain hex digest is the earlier one."""
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
    a checksum recorded earlier (a step record a replay checks): computed in its format. The
    format of logs before 2026-11-24 is a plain hex digest, sha256 over the same header lines
    and the raw bytes in one stream (one core). ``dtype``: of the floating-point weights cast
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
        return _stream_checksum(tensors, specs)
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
    sums = [_word_sum(tensors[s.name].detach().to(s.dtype)) for s in specs if s.numel]
    values = iter(torch.stack(sums).tolist() if sums else [])  # one wait for the device
    h = hashlib.sha256()
    for spec in specs:
        value = next(values) if spec.numel else 0
        h.update(f"{_header(spec)}:{value}\n".encode())
    return WSUM + h.hexdigest()


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


def _stream_checksum(tensors: Mapping[str, Tensor], specs: list[TensorSpec]) -> str:
    h = hashlib.sha256()
    for spec in specs:
        h.update(f"{_header(spec)}\n".encode())
        if spec.numel:
            h.update(memoryview(_raw(tensors[spec.name]).numpy()))  # type: ignore[arg-type]
    return h.hexdigest()
