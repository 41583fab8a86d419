"""The trainer's update backend: where the policy's weights, gradients and optimizer state live.

The trainer's loop (``consumers/trainer.py``) reads samples, records steps and drives the weight
sync; a backend holds the policy and does the rest, behind one small interface:

* ``step``: one local update on a step's samples (verl's actor update), its metrics back;
* ``snapshot`` / ``load``: the backend's part of a checkpoint (``consumers/checkpoint.py``);
* ``model``: the module whose full weights the sync publishes, the checksum hashes and the
  held-out evaluation runs.

:func:`make_backend` picks :class:`~asyncrl.consumers.local_update.LocalUpdate` (one process,
one device). :class:`~asyncrl.consumers.fsdp_update.FsdpUpdate` shards the policy over the
ranks of a ``torch.distributed`` group (docs/design.md, "The trainer's update backend").
Benchmarks pass their own (``bench/sim_update.py``) to the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from asyncrl.config import RunConfig
    from asyncrl.consumers.checkpoint import ShardedWrite, Snapshot, TrainerState
    from asyncrl.schemas.sample import Sample


class UpdateBackend(Protocol):
    model: torch.nn.Module
    """The policy as the sync, the checksum and the evaluation see it (full weights)."""
    tokenizer: Any
    device: torch.device
    learns: bool
    """False where ``step`` only models an update's time (held-out evaluation is then off)."""

    def step(self, samples: list[Sample], step: int, version: int) -> dict[str, float]:
        """Local update number ``step`` (1-based) on ``samples``, at weight ``version``."""
        ...

    def snapshot(self, state: TrainerState) -> Snapshot | ShardedWrite:
        """The checkpoint of now: tensors copied to host memory, for a writer's thread (a sharded
        backend's: this rank's shards, being written)."""
        ...

    def load(self, path: Path) -> TrainerState:
        """Load the checkpoint at ``path`` into the policy and optimizer; its trainer state."""
        ...


def make_backend(cfg: RunConfig) -> UpdateBackend:
    """The one-process backend for ``cfg``."""
    from asyncrl.consumers.local_update import LocalUpdate

    return LocalUpdate(cfg)
