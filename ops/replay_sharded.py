"""``asyncrl replay step N`` on N trainer ranks: the step re-run as a sharded trainer ran it.

A step of N ranks (FSDP2, ``consumers/fsdp_update.py``) sums each rank's gradients over the
group; on another rank count the sums add up in another order, so only a replay on the same N
can reproduce its weights bit for bit. This spawns the ranks (gloo on the CPU, a rendezvous
file in a temporary directory) and hands each the step's samples as the Arrow records of the
``samples`` topic (decoded, never unpickled). Each rank loads the checkpoint the step started
from (sharded by any rank count, or one process's: DCP reshards it), sets the step's learning
rate and runs its share of the update as the trainer's ``FsdpUpdate.step`` does; rank 0 writes
the metrics and the gathered weights for ``replay_step`` to compare with the step's checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from asyncrl.config import RunConfig
from asyncrl.schemas.sample import Sample


def replay_on_ranks(
    cfg: RunConfig,
    policy_cfg: RunConfig,
    step: int,
    version: int,
    samples: list[Sample],
    ranks: int,
    lr: float | None,
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Re-run ``step`` on ``ranks`` spawned ranks from the checkpoint of ``step - 1`` (the
    policy ``policy_cfg`` builds, at step 1); its metrics and the whole weights after it.
    ``lr``: the rate to run at (None: ``cfg``'s schedule at ``step``)."""
    import torch.multiprocessing as mp

    from asyncrl.schemas.sample import encode_sample

    blobs = [encode_sample(s) for s in samples]
    with tempfile.TemporaryDirectory(prefix="asyncrl-replay-") as out:
        os.environ.setdefault("OMP_NUM_THREADS", str(cfg.trainer.torch_threads))
        args = (ranks, out, cfg, policy_cfg, step, version, blobs, lr)
        mp.start_processes(_rank, args=args, nprocs=ranks, start_method="spawn")
        metrics = json.loads(Path(out, "metrics.json").read_text())
        weights = torch.load(Path(out, "weights.pt"), weights_only=True)
    return metrics, weights


def _rank(
    rank: int,
    world: int,
    out: str,
    cfg: RunConfig,
    policy_cfg: RunConfig,
    step: int,
    version: int,
    blobs: list[bytes],
    lr: float | None,
) -> None:
    import torch.distributed as dist

    from asyncrl.consumers.checkpoint import checkpoint_dir
    from asyncrl.consumers.fsdp_update import FsdpUpdate
    from asyncrl.consumers.schedule import set_step_lr
    from asyncrl.consumers.update import grpo_update
    from asyncrl.models.warm_start import load_policy
    from asyncrl.schemas.sample import decode_sample

    torch.set_num_threads(cfg.trainer.torch_threads)
    init = f"file://{out}/rendezvous"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        # The first policy where step 1 starts from it or actor.use_kl_loss keeps it (the
        # reference); else an untrained one of its shape, the checkpoint loaded over it
        warm = step == 1 or cfg.actor_rollout_ref.actor.use_kl_loss
        backend = FsdpUpdate(cfg, policy=load_policy(policy_cfg, warm=warm))
        if step > 1:
            backend.load(checkpoint_dir(cfg.run_dir, step - 1))
        optim = cfg.actor_rollout_ref.actor.optim
        for group in backend.optimizer.param_groups:  # the replay's settings
            group["weight_decay"] = optim.weight_decay
        set_step_lr(backend.optimizer, optim, step, cfg.trainer.total_training_steps)
        if lr is not None:
            for group in backend.optimizer.param_groups:
                group["lr"] = lr
        samples = [decode_sample(b) for b in blobs]
        metrics: dict[str, Any] = grpo_update(
            *(backend.model, backend.optimizer, backend.share(samples), backend.local_cfg),
            backend.device,
            pad_token_id=backend.tokenizer.pad_token_id,
            version=version,
            ref_model=backend.ref_model,
            group=backend.group,
        )
        weights = backend.full_state_dict()
        if rank == 0:
            torch.save(weights, Path(out, "weights.pt"))
            Path(out, "metrics.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()
