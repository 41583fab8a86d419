"""Plan, pack and unpack weight buckets for the trainer -> worker broadcast.

Sending one collective per tensor costs a round trip per tensor, which dominates for models
with many small tensors (``asyncrl bench sync``'s per-tensor row against its bucketed one:
docs/benchmarks.md). So both sides derive the same *manifest* (which tensors, in which order)
and the same *bucket plan* from it, and only flat buffers cross the wire: no names, shapes or
offsets are sent, just a digest of the manifest so the two sides can check they agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "Bucket",
    "TensorSpec",
    "cast_dtype",
    "manifest_digest",
    "named_tensors",
    "pack",
    "plan_buckets",
    "storage_key",
    "untied_aliases",
    "unpack",
    "weight_manifest",
]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to transfer. ``aliases`` are other names sharing its storage (tied weights)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    numel: int
    aliases: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)

    @property
    def names(self) -> tuple[str, ...]:
        """The primary name followed by every alias: all of them get the received values."""
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class Bucket:
    """Tensors of one dtype laid out back to back in one flat buffer (element offsets)."""

    index: int
    dtype: torch.dtype
    specs: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize  # (an empty tensor per call cost ~1 ms a broadcast at 150 tensors)


def named_tensors(model_or_state: nn.Module | Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Every parameter and persistent buffer by name; tied tensors appear under each name."""
    if isinstance(model_or_state, nn.Module):
        state: Mapping[str, Any] = model_or_state.state_dict(keep_vars=True)
    elif isinstance(model_or_state, Mapping):
        state = model_or_state
    else:
        raise TypeError(f"expected an nn.Module or a dict of tensors, got {type(model_or_state)}")
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name!r} is a {type(t).__name__}, not a tensor")
        out[name] = t
    return out


def storage_key(t: Tensor) -> tuple:
    """Identity of the memory a tensor views: equal keys mean the names are tied."""
    return (
        t.device,
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
    )


def weight_manifest(
    model_or_state: nn.Module | Mapping[str, Tensor], dtype: torch.dtype | None = None
) -> list[TensorSpec]:
    """The tensors to send, sorted by name, each storage once (tied names become aliases).

    Sorting by name (not module registration order) makes a model and a state dict loaded from
    a file produce the same manifest. A tied group is listed under its first name; the other
    names are its aliases, so the bytes travel once and every name is updated. ``dtype``: the
    dtype the floating-point tensors travel in (``cast_dtype``), as a worker holding the
    policy in that dtype derives its own manifest; None: their own.
    """
    tensors = named_tensors(model_or_state)
    groups: dict[tuple, list[str]] = {}
    for name in sorted(tensors):
        t = tensors[name]
        # Zero-element tensors may all report data_ptr 0: never tie those.
        key = storage_key(t) if t.numel() > 0 else ("empty", name)
        groups.setdefault(key, []).append(name)
    specs = []
    for names in groups.values():
        t = tensors[names[0]]
        specs.append(
            TensorSpec(
                name=names[0],
                shape=tuple(t.shape),
                dtype=cast_dtype(t.dtype, dtype),
                numel=t.numel(),
                aliases=tuple(names[1:]),
            )
        )
    specs.sort(key=lambda s: s.name)
    return specs


def cast_dtype(dtype: torch.dtype, to: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels in when the receiver holds floating-point
    weights in ``to`` (the rollout's dtype): integer and bool tensors keep theirs."""
    return to if to is not None and dtype.is_floating_point else dtype


def manifest_digest(manifest: list[TensorSpec]) -> str:
    """sha256 (hex) of names, aliases, shapes and dtypes, in order: equal digests, equal plans."""
    h = hashlib.sha256()
    for s in manifest:
        h.update(f"{s.name}|{','.join(s.aliases)}|{list(s.shape)}|{s.dtype}\n".encode())
    return h.hexdigest()


def plan_buckets(manifest: list[TensorSpec], bucket_bytes: int) -> list[Bucket]:
    """Group the manifest into buckets of at most ``bucket_bytes``, one dtype per bucket.

    Dtypes are taken in order of first appearance and tensors in manifest order, so the plan
    is a pure function of (manifest, bucket_bytes) and both sides compute the same one. A
    tensor larger than ``bucket_bytes`` gets a bucket of its own (and can be sent unpacked).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    by_dtype: dict[torch.dtype, list[TensorSpec]] = {}
    for spec in manifest:
        by_dtype.setdefault(spec.dtype, []).append(spec)

    groups: list[tuple[torch.dtype, list[TensorSpec]]] = []
    for dtype, specs in by_dtype.items():
        current: list[TensorSpec] = []
        current_bytes = 0
        for spec in specs:
            if spec.nbytes > bucket_bytes:
                groups.append((dtype, [spec]))
                continue
            if current and current_bytes + spec.nbytes > bucket_bytes:
                groups.append((dtype, current))
                current, current_bytes = [], 0
            current.append(spec)
            current_bytes += spec.nbytes
        if current:
            groups.append((dtype, current))

    buckets = []
    for index, (dtype, specs) in enumerate(groups):
        offsets, total = [], 0
        for spec in specs:
            offsets.append(total)
            total += spec.numel
        buckets.append(Bucket(index, dtype, tuple(specs), tuple(offsets), total))
    return buckets


def pack(
    bucket: Bucket,
    tensors: Mapping[str, Tensor],
    out: Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Copy the bucket's tensors into one flat 1-D tensor of ``bucket.dtype``, casting
    floating-point ones whose dtype differs (a float32 trainer packing for bf16 workers).

    ``out`` (at least ``bucket.numel`` elements of the bucket's dtype) is reused when given, so
    a sender can double-buffer; otherwise a buffer is allocated on ``device`` (default: the
    first tensor's device).
    """
    if out is None:
        if device is None:
            device = tensors[bucket.specs[0].name].device
        out = torch.empty(bucket.numel, dtype=bucket.dtype, device=device)
    elif out.dtype != bucket.dtype or out.dim() != 1 or out.numel() < bucket.numel:
        raise ValueError(
            f"pack: out must be 1-D {bucket.dtype} with >= {bucket.numel} elements, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    flat = out[: bucket.numel]
    with torch.no_grad():
        for spec, offset in zip(bucket.specs, bucket.offsets, strict=True):
            src = tensors[spec.name]
            _check(spec, src, cast=True)
            flat[offset : offset + spec.numel].view(spec.shape).copy_(src)
    return flat


def unpack(bucket: Bucket, flat: Tensor, into: Mapping[str, Tensor]) -> None:
    """Copy a received flat buffer into the existing tensors, in place, under no_grad.

    In place so that anything holding the parameters (an optimizer, an inference engine's
    references) sees the new values. Aliases sharing the primary's storage are updated by that
    one copy; an alias that does not share it (an untied copy) is copied too.
    """
    if flat.numel() < bucket.numel:
        raise ValueError(f"unpack: buffer has {flat.numel()} elements, bucket {bucket.numel}")
    with torch.no_grad():
        for spec, offset in zip(bucket.specs, bucket.offsets, strict=True):
            src = flat[offset : offset + spec.numel].view(spec.shape)
            primary = into[spec.name]
            _check(spec, primary)
            primary.copy_(src)
            for dst in untied_aliases(spec, into):
                _check(spec, dst)
                dst.copy_(src)


def untied_aliases(spec: TensorSpec, tensors: Mapping[str, Tensor]) -> list[Tensor]:
    """The tensors of ``spec``'s aliases that do not share its primary's storage (an untied
    copy): a received value must be copied into each of them too."""
    primary = tensors[spec.name]
    aliases = (tensors[alias] for alias in spec.aliases)
    return [t for t in aliases if storage_key(t) != storage_key(primary)]


def _check(spec: TensorSpec, t: Tensor, cast: bool = False) -> None:
    """``t`` is what ``spec`` describes (``cast``: or a floating-point tensor cast to it)."""
    same = t.dtype == spec.dtype or (
        cast and t.dtype.is_floating_point and spec.dtype.is_floating_point
    )
    if tuple(t.shape) != spec.shape or not same:
        raise ValueError(
            f"{spec.name}: expected {spec.dtype} {list(spec.shape)}, got {t.dtype} {list(t.shape)}"
        )


def manifest_diff(ref: list, other: list, worker: int) -> list[str]:
    """Human-readable differences between the trainer's manifest summary and a worker's (the
    rows the two ends exchange when their digests differ: name, tied names, shape, dtype)."""
    a = {row[0]: row for row in ref}
    b = {row[0]: row for row in other}
    out = []
    for name in sorted(a.keys() - b.keys()):
        out.append(f"{name}: on the trainer, missing on worker {worker}")
    for name in sorted(b.keys() - a.keys()):
        out.append(f"{name}: on worker {worker}, not on the trainer")
    for name in sorted(a.keys() & b.keys()):
        (_, ta, sa, da), (_, tb, sb, db) = a[name], b[name]
        if (sa, da) != (sb, db):
            out.append(f"{name}: trainer {da} {list(sa)}, worker {worker} {db} {list(sb)}")
        elif ta != tb:
            out.append(f"{name}: tied to {list(ta)} on the trainer, {list(tb)} on worker {worker}")
    return out or [f"worker {worker}: manifests differ in order"]
