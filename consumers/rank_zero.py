"""Rank 0's update backend: the trainer of a sharded run (``consumers/backend.py``'s seam).

Rank 0 runs the trainer's loop (``consumers/trainer.py``) unchanged: it reads the samples,
records the steps, checkpoints, syncs the workers and evaluates, as one trainer process does.
This backend turns what the loop asks of it into the group's work: each ``step`` is a
command to the other ranks (``consumers/ranks.py``), the step's samples broadcast to them
(``broadcast_samples``) and the FSDP2 step on every rank (``FsdpUpdate``); ``snapshot`` and
``load`` are the group's checkpoint collectives (``consumers/rank_checkpoint.py``).

``model``, which the loop's weight sync, checksum and held-out evaluation read, is a full copy
of the policy in rank 0's host memory: after every step the ranks gather the new weights into
it (``FsdpUpdate.full_state_dict``). So those read a plain module, need no collective, and a
worker that joins between two syncs gets current weights. What it costs: one copy of the
weights on rank 0's host and one gather per step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.checkpoint import Snapshot, TrainerState
from asyncrl.consumers.fsdp_update import FsdpUpdate, broadcast_samples
from asyncrl.consumers.rank_checkpoint import gather_snapshot, load_broadcast
from asyncrl.consumers.ranks import RankGroup
from asyncrl.schemas.sample import Sample


class RankZeroUpdate:
    learns = True

    def __init__(
        self,
        cfg: RunConfig,
        group: RankGroup,
        policy: tuple[torch.nn.Module, Any] | None = None,
    ):
        """``policy``: (model, tokenizer), the same on every rank; None: the run's."""
        from asyncrl.models.warm_start import load_policy

        self.group = group
        model, tokenizer = policy or load_policy(cfg)
        self.model = copy.deepcopy(model).requires_grad_(False)
        """The full weights after the last step (or load), in host memory."""
        self.device = torch.device("cpu")
        self.fsdp = FsdpUpdate(cfg, policy=(model, tokenizer))
        self.tokenizer = self.fsdp.tokenizer

    def step(self, samples: list[Sample], step: int, version: int) -> dict[str, float]:
        self.group.send("step", step=step, version=version)
        metrics = self.fsdp.step(broadcast_samples(samples), step, version)
        self.model.load_state_dict(self.fsdp.full_state_dict())
        return metrics

    def snapshot(self, state: TrainerState) -> Snapshot:
        self.group.send("snapshot", step=state.step)
        snap = gather_snapshot(self.fsdp, self.model, state)
        assert snap is not None  # rank 0's
        return snap

    def load(self, path: Path) -> TrainerState:
        self.group.send("load", path=str(path))
        state = load_broadcast(self.fsdp, self.model, path)
        assert state is not None  # rank 0's
        return state

    def stop(self) -> None:
        """Tell the other ranks that the trainer has ended: they exit."""
        self.group.stop_others()
