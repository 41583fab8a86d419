"""Weights through a safetensors file, written atomically: ``asyncrl bench sync``'s
``safetensors`` row, what moving the weights through shared disk would cost next to the
collective.

The sender writes ``weights-v{version}.safetensors`` and the receiver loads it into its model
in place. The file is written to a temporary name and renamed, so a reader never sees a partial
file. Tied tensors are stored once, under their manifest name; the other names are recorded
in the metadata and filled from it on load.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from asyncrl.sync.buckets import manifest_digest, named_tensors, weight_manifest

__all__ = ["load_snapshot", "save_snapshot", "snapshot_path"]


def snapshot_path(dir: str | Path, version: int) -> Path:
    """Where the snapshot of ``version`` lives in ``dir``."""
    return Path(dir) / f"weights-v{version:08d}.safetensors"


def save_snapshot(model: nn.Module | Mapping[str, Tensor], dir: str | Path, version: int) -> Path:
    """Write the model's weights for ``version``; atomic (temp file, fsync, rename)."""
    tensors = named_tensors(model)
    manifest = weight_manifest(tensors)
    payload = {s.name: tensors[s.name].detach().to("cpu").contiguous() for s in manifest}
    metadata = {
        "version": str(int(version)),
        "manifest_digest": manifest_digest(manifest),
        "aliases": json.dumps({s.name: list(s.aliases) for s in manifest if s.aliases}),
    }
    path = snapshot_path(dir, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(payload, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_snapshot(model: nn.Module | Mapping[str, Tensor], path: str | Path) -> int:
    """Copy a snapshot into ``model``'s tensors in place; returns the snapshot's version.

    Every tensor of the model must be in the file with the same shape and dtype (missing or
    extra names are an error, not a partial load).
    """
    tensors = named_tensors(model)
    manifest = weight_manifest(tensors)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        metadata = f.metadata() or {}
        stored = set(f.keys())
        aliases: dict[str, list[str]] = json.loads(metadata.get("aliases", "{}"))
        available = stored | {a for names in aliases.values() for a in names}
        missing = sorted(set(tensors) - available)
        extra = sorted(stored - set(tensors))
        if missing or extra:
            raise ValueError(
                f"snapshot {path} does not match the model: missing {missing[:10]}, "
                f"unexpected {extra[:10]}"
            )
        source_of = {a: name for name, names in aliases.items() for a in names}
        with torch.no_grad():
            # Names tied in the model share one storage, so one copy per spec updates them all.
            for spec in manifest:
                src_name = spec.name if spec.name in stored else source_of[spec.name]
                src = f.get_tensor(src_name)
                dst = tensors[spec.name]
                if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
                    raise ValueError(
                        f"snapshot {path}: {spec.name} is {src.dtype} {list(src.shape)}, "
                        f"the model has {dst.dtype} {list(dst.shape)}"
                    )
                dst.copy_(src)
    return int(metadata.get("version", -1))
