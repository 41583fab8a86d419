"""A sharded trainer's checkpoint in the one-process format, gathered to and loaded from rank 0.

Rank 0 writes the checkpoint of a sharded trainer as the one-process trainer writes its own
(``consumers/checkpoint.py``: ``model.pt``, ``optimizer.pt``, ``rng.pt``, ``state.json``):
the weights are rank 0's full copy of the policy (``consumers/rank_zero.py`` keeps it
current), and AdamW's state is gathered from the ranks' shards into rank 0's host memory,
keyed by parameter index as ``torch.optim`` keys it. A load reads the files on rank 0 and
broadcasts them into every rank's shards. So such a checkpoint loads at any rank count, one
included, and ``export-model`` and ``replay`` read it as they read any other. What it costs:
rank 0's host memory holds the whole optimizer state while a snapshot is taken.

Every rank calls ``gather_snapshot`` and ``load_broadcast`` (they are collectives); only rank 0
passes its full copy (``mirror``) and gets a result.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.consumers.checkpoint import Snapshot, TrainerState, load_checkpoint, snapshot

if TYPE_CHECKING:
    import torch

    from asyncrl.consumers.fsdp_update import FsdpUpdate


def gather_snapshot(
    fsdp: FsdpUpdate, mirror: torch.nn.Module | None, state: TrainerState | None
) -> Snapshot | None:
    """The checkpoint of now on rank 0 (``mirror`` and ``state`` given); None elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name = get_optimizer_state_dict(fsdp.model, fsdp.optimizer, options=options)
    if mirror is None or state is None:
        return None
    return snapshot(mirror, _Gathered(_by_index(by_name, fsdp.model)), state)  # type: ignore[arg-type]


def load_broadcast(
    fsdp: FsdpUpdate, mirror: torch.nn.Module | None, path: Path | None
) -> TrainerState | None:
    """Load the checkpoint at ``path`` into ``mirror`` and from there into every rank's shards
    of the policy and of AdamW's state; rank 0's trainer state (None elsewhere)."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    state, weights, optim = None, {}, {}
    if mirror is not None and path is not None:
        state = load_checkpoint(path, mirror)  # its weights, the RNG, the trainer's state
        weights = mirror.state_dict()
        saved = torch.load(path / "optimizer.pt", weights_only=True)
        optim = _by_name(saved, fsdp.model)
    set_model_state_dict(fsdp.model, weights, options=options)
    set_optimizer_state_dict(fsdp.model, fsdp.optimizer, optim, options=options)
    return state


class _Gathered:
    """An optimizer's state already gathered, where ``snapshot`` asks an optimizer for it."""

    def __init__(self, state: dict[str, Any]):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def _names(model: torch.nn.Module) -> list[str]:
    """The parameters' names in the optimizer's order (AdamW was given ``model.parameters()``)."""
    return [name for name, _ in model.named_parameters()]


def _by_index(by_name: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """A gathered optimizer state keyed by parameter name, keyed by index as
    ``Optimizer.state_dict`` keys it."""
    index = {name: i for i, name in enumerate(_names(model))}
    return {
        "state": {index[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in by_name["param_groups"]
        ],
    }


def _by_name(by_index: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """The inverse of ``_by_index``."""
    names = _names(model)
    return {
        "state": {names[i]: value for i, value in by_index["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in by_index["param_groups"]
        ],
    }
