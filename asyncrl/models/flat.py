"""A model's parameters moved into one buffer per dtype, back to back in ``named_parameters``
order, each parameter a view of it.

Why: a weight handoff on one GPU copies every trainer tensor into the worker's. Apart, a 0.5B
model's 290 tensors cost one multi-tensor copy at about half of what one device-to-device copy
moves (docs/benchmarks-archive.md, "One H100 (2026-11-27)"). When both roles hold their weights
this way, the worker's copy plan (:func:`asyncrl.sync.copy_plan.coalesce`) merges them into one
copy of the whole buffer, at the copy's own speed. The roles do it on a GPU only: on a CPU the
weights read in place move into a shared file of their own, tensor by tensor (``sync.direct``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

__all__ = ["ALIGN_ELEMENTS", "copy_model", "flat_copies", "flatten_parameters", "is_flat"]

ALIGN_ELEMENTS = 16
"""Each parameter starts at a multiple of this many elements: 16 bytes or more, the alignment
of a matmul's vectorized loads, and the same layout in every dtype (a float32 trainer's buffer
and a bf16 worker's line up). A size that is no multiple of it leaves a gap, where a handoff's
copy splits in two."""


def flatten_parameters(model: nn.Module) -> int:
    """Move every parameter of ``model`` into one buffer per (device, dtype), in place: the
    same ``Parameter`` objects (an optimizer made before keeps them), their ``.data`` now
    views. Tied parameters stay one. Returns how many buffers were made.

    Call it before anything keeps the parameters' addresses (CUDA graphs) and after the model
    reached its device and dtype (a later ``.to`` moves them apart again), before the
    optimizer's state exists: for a moment a dtype's parameters are held twice."""
    params = list(model.parameters())  # each tied parameter once
    views = _packed(params)
    for p, view in zip(params, views, strict=True):
        p.data = view
    return len({v.untyped_storage().data_ptr() for v in views})


def copy_model(model: nn.Module) -> nn.Module:
    """A deep copy of ``model``, flat where ``model`` is (``copy.deepcopy`` copies each
    parameter into memory of its own)."""
    twin = copy.deepcopy(model)
    if is_flat(model):
        flatten_parameters(twin)
    return twin


def flat_copies(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Copies of ``tensors`` laid out as :func:`flatten_parameters` lays out a model's (a
    tensor under two names stays one): a state dict shaped like a flat model's."""
    unique = list({id(t): t for t in tensors.values()}.values())
    packed = {id(t): v for t, v in zip(unique, _packed(unique), strict=True)}
    return {name: packed[id(t)] for name, t in tensors.items()}


def _packed(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Each tensor copied into one new buffer per (device, dtype), in order, each start
    aligned to ``ALIGN_ELEMENTS``."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[Tensor] = list(tensors)
    with torch.no_grad():
        for (device, dtype), members in groups.items():
            step = ALIGN_ELEMENTS
            offsets, total = [], 0
            for i in members:
                offsets.append(total)
                total += -(-tensors[i].numel() // step) * step
            flat = torch.zeros(total, dtype=dtype, device=device)
            for i, offset in zip(members, offsets, strict=True):
                t = tensors[i]
                out[i] = flat[offset : offset + t.numel()].view(t.shape)
                out[i].copy_(t)
    return out


def is_flat(model: nn.Module) -> bool:
    """Every parameter after the one before it of its dtype in one buffer, as
    :func:`flatten_parameters` leaves them."""
    last: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
    for p in model.parameters():
        key = (p.device, p.dtype)
        prev = last.get(key)
        if prev is not None and not (
            p.untyped_storage().data_ptr() == prev.untyped_storage().data_ptr()
            and p.storage_offset() >= prev.storage_offset() + prev.numel()
            and p.is_contiguous()
        ):
            return False
        last[key] = p
    return True
