"""Reading a sharded checkpoint's tensors (``consumers/fsdp_checkpoint.py`` writes them) into a
model and optimizer, sharded over ranks or whole in one process.

DCP (``torch.distributed.checkpoint``) reads into each tensor of the state dict it is given the
pieces of the saved tensors it covers, whatever number of ranks wrote them: N ranks' shards
load into M ranks' (a resume on another rank count reshards), and into one process's whole
model (``LocalUpdate``'s resume, ``asyncrl replay``, ``asyncrl export-model``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SHARDS = "shards"
"""The checkpoint's DCP directory: ``__<rank>_0.distcp`` per rank and ``.metadata``."""


def world_size_of(path: Path) -> int:
    """The number of ranks that wrote the checkpoint at ``path`` (1: a one-process one)."""
    raw = json.loads((path / "state.json").read_text())
    return int(raw.get("world_size", 1))


def read_whole(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """The weights and optimizer state of the sharded checkpoint at ``path`` into one
    process's whole model and optimizer; its RNG where one rank wrote it."""
    load_shards(path, model, optimizer, None, alone=True)
    if world_size_of(path) == 1:
        torch.set_rng_state(torch.load(path / "rng_0.pt", weights_only=True)["torch"])


def read_weights(path: Path, model: torch.nn.Module) -> None:
    """Only the weights of the sharded checkpoint at ``path``, into one process's model."""
    load_shards(path, model, None, None, alone=True)


def load_shards(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    group: dist.ProcessGroup | None,
    alone: bool,
) -> None:
    """DCP reads into the state dicts of ``model`` and ``optimizer`` (sharded over ``group``,
    or whole in a process reading ``alone``) the pieces of the saved tensors each covers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
    reader = dcp.FileSystemReader(path / SHARDS)
    with warnings.catch_warnings():  # alone: DCP warns that it assumes so, which is the intent
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=reader, process_group=group, no_dist=alone)
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
