"""Sharded checkpoints of the FSDP2 backend (``consumers/fsdp_update.py``), written with
``torch.distributed.checkpoint`` (DCP): each rank writes only its own shards.

A checkpoint ``checkpoints/step_N/`` of N ranks holds (docs/design.md, "Sharded checkpoints"):

* ``shards/``: DCP's files, the policy's weights and AdamW's state: ``__<r>_0.distcp`` per rank
  (its shards) and ``.metadata`` (which piece of which tensor is where), written by rank 0
  once every rank's files are written;
* ``rng_<r>.pt``: rank r's torch RNG state;
* ``state.json``: the trainer state as a one-process checkpoint has it (step, version, the
  batcher's consumer offsets and settled ids, metrics) and ``world_size``, written by rank 0.

Writing, in order:

1. every rank: waits for its write before (one in flight), agrees on the temporary directory
   rank 0 made (its pid, broadcast), writes its RNG there;
2. every rank: ``dcp.async_save`` of its shards: the copy into host memory (this rank's 1/N of
   the weights and optimizer state, never a gathered whole) before it returns, the write on a
   thread. Its collectives run over a gloo group of their own, created with the backend: on
   the training group they would interleave with the step's;
3. rank 0's ``finish`` (the trainer's checkpoint writer thread): DCP's last collective returns
   there once every rank's files are written and ``.metadata`` with them; then ``state.json``,
   and the directory is renamed into place (``publish_checkpoint``), as one process's is. A
   checkpoint is complete (``latest_checkpoint``) or not used.

The ranks share the run's directory (one machine, or a shared filesystem across nodes).

Loading: DCP reads each rank's pieces of the saved tensors, whatever N wrote them, so a
resume on another rank count reshards; one process (``LocalUpdate``, ``asyncrl replay``,
``export-model``) reads a sharded checkpoint whole (``consumers/dcp_read.py``), and N ranks read a
one-process checkpoint (``model.pt``) through rank 0, its pieces sent to each rank's shards.
DCP's planning collectives exchange pickled plans between the group's own ranks; nothing
read from the log or the network is unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from asyncrl.consumers.checkpoint import (
    CheckpointWriteError,
    TrainerState,
    checkpoint_dir,
    is_sharded,
    publish_checkpoint,
    read_trainer_state,
    state_json,
    temporary_dir,
)
from asyncrl.consumers.dcp_read import SHARDS, load_shards, world_size_of


@dataclass
class ShardedSnapshot:
    """One rank's part of a checkpoint being written (``consumers/checkpoint.ShardedWrite``)."""

    step: int
    rank: int
    tmp: Path
    state: dict[str, Any]
    upload: Future[Any]

    def finish(self, run_dir: Path, keep: int) -> Path:
        """Wait for this rank's shards; on rank 0 (whose wait ends once every rank's are
        written), write ``state.json`` and publish the checkpoint. Its path."""
        try:
            self.upload.result()
        except BaseException:
            if self.rank == 0:
                shutil.rmtree(self.tmp, ignore_errors=True)  # a full disk gets its room back
            raise
        if self.rank:
            return checkpoint_dir(run_dir, self.step)
        (self.tmp / "state.json").write_text(json.dumps(self.state))
        return publish_checkpoint(run_dir, self.tmp, self.step, keep)


class ShardedCheckpointer:
    """The sharded checkpoints of one rank's FSDP2 model and optimizer. Built on every rank of
    ``group`` (it creates the write group: a collective)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        group: dist.ProcessGroup | None,
        run_dir: Path,
    ) -> None:
        """``group``: the ranks' (None: the default group)."""
        self.model, self.optimizer, self.group, self.run_dir = model, optimizer, group, run_dir
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group) if group else list(range(self.world))
        self.write_group = dist.new_group(ranks, backend="gloo")
        self._upload: Future[Any] | None = None

    def snapshot(self, state: TrainerState) -> ShardedSnapshot:
        """Start writing this rank's part of the checkpoint of ``state.step``; every rank calls
        it at the same step (a collective). Returns once its shards are in host memory."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self._upload is not None:
            self._upload.result()  # the write before: one at a time, its copies let go
        pid = torch.tensor([os.getpid()], dtype=torch.int64)
        failed: OSError | None = None
        if self.rank == 0:
            tmp = temporary_dir(self.run_dir, state.step, os.getpid())
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                tmp.mkdir(parents=True)
            except OSError as err:  # -1: every rank stops, none waits for the others
                failed, pid[0] = err, -1
        dist.broadcast(pid, group=self.write_group, group_src=0)  # after rank 0 made it
        if int(pid) < 0:
            why = failed.strerror if failed is not None else "see rank 0"
            raise CheckpointWriteError(
                f"cannot write the checkpoint of step {state.step} in "
                f"{temporary_dir(self.run_dir, state.step, 0).parent}: {why}"
            ) from failed
        tmp = temporary_dir(self.run_dir, state.step, int(pid))
        torch.save({"torch": torch.get_rng_state()}, tmp / f"rng_{self.rank}.pt")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        upload = dcp.async_save(
            {"model": model_sd, "optimizer": optim_sd},
            storage_writer=dcp.FileSystemWriter(tmp / SHARDS),
            process_group=self.write_group,
        )
        self._upload = cast(Future, upload)  # the default stager copies before returning
        raw = {**state_json(state), "world_size": self.world}
        return ShardedSnapshot(state.step, self.rank, tmp, raw, self._upload)

    def wait(self) -> None:
        """Until this rank's last write is done (it raises what the write raised)."""
        if self._upload is not None:
            upload, self._upload = self._upload, None
            upload.result()

    def load(self, path: Path) -> TrainerState:
        """Load the checkpoint at ``path`` (sharded by any number of ranks, or one process's)
        into this rank's shards; every rank calls it (a collective). Its trainer state."""
        if is_sharded(path):
            load_shards(path, self.model, self.optimizer, self.group, alone=False)
        else:
            _load_whole(path, self.model, self.optimizer, self.rank)
        if world_size_of(path) == self.world:  # the same ranks: each its own RNG again
            rng = path / f"rng_{self.rank}.pt"
            torch.set_rng_state(torch.load(rng, weights_only=True)["torch"])
        return read_trainer_state(path)


def _load_whole(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int
) -> None:
    """A one-process checkpoint (model.pt, optimizer.pt) into the ranks' shards: rank 0 reads
    it, and each rank receives its pieces (``broadcast_from_rank0``), so no other rank holds
    the whole. The optimizer's state, keyed by parameter number there, is keyed by name here."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    weights = torch.load(path / "model.pt", weights_only=True) if rank == 0 else {}
    set_model_state_dict(model, weights, options=options)
    del weights
    named: dict[str, Any] = {}
    if rank == 0:
        saved = torch.load(path / "optimizer.pt", weights_only=True)
        names = [name for name, _ in model.named_parameters()]
        named = {
            "state": {names[i]: s for i, s in saved["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]
            ],
        }
    set_optimizer_state_dict(model, optimizer, named, options=options)
