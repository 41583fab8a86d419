"""The sharded update backend: FSDP2 (``torch.distributed.fsdp.fully_shard``) over N ranks.

Every rank builds this after ``torch.distributed.init_process_group`` (gloo on the CPU, NCCL on
GPUs) and loads the same starting policy (the same seed); ``fully_shard`` then shards each
transformer block and the root, so each rank holds 1/N of the parameters, their gradients and
AdamW's state. Precision is as on one rank (``consumers/precision.py``): float32 weights, the
forward passes under autocast.

A step takes verl's batch semantics across ranks: each global mini-batch of
``ppo_mini_batch_size`` samples is split into N equal shares, rank r training the r-th, with
its micro-batches per rank (``ppo_micro_batch_size_per_gpu``); the loss divides by the whole
mini-batch's norms and the gradients sum over the ranks, so a step's update is the one-rank
step's, to float rounding (``policy_step``). Every rank calls ``step`` with the whole step's
samples, in the same order; the batch statistics are computed over all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asyncrl.config import RunConfig
from asyncrl.consumers.checkpoint import TrainerState
from asyncrl.consumers.fsdp_checkpoint import ShardedCheckpointer, ShardedSnapshot
from asyncrl.models.policy import resolve_device
from asyncrl.schemas.sample import Sample


class FsdpUpdate:
    learns = True

    def __init__(
        self,
        cfg: RunConfig,
        group: dist.ProcessGroup | None = None,
        policy: tuple[torch.nn.Module, Any] | None = None,
    ):
        """``policy``: (model, tokenizer) to shard, the same on every rank; None: the run's
        (``load_policy``)."""
        from torch.distributed.fsdp import fully_shard

        from asyncrl.consumers.update import reference_policy
        from asyncrl.models.warm_start import load_policy

        self.cfg = cfg
        self.group = group or dist.group.WORLD
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        if size % self.world:
            raise ValueError(
                f"actor_rollout_ref.actor.ppo_mini_batch_size: {size} samples do not split "
                f"evenly over {self.world} trainer ranks"
            )
        if cfg.actor_rollout_ref.actor.use_dynamic_bsz:
            raise ValueError(
                "actor_rollout_ref.actor.use_dynamic_bsz: not with more than one trainer rank "
                "(the ranks' micro-batch counts must agree)"
            )
        self.local_cfg = cfg.model_copy(deep=True)
        self.local_cfg.actor_rollout_ref.actor.ppo_mini_batch_size = size // self.world
        device = resolve_device(cfg.trainer.device)
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        torch.manual_seed(cfg.trainer.seed)
        self.model, self.tokenizer = policy or load_policy(cfg)
        self.model.to(self.device).train()
        self.ref_model = reference_policy(cfg, self.device, start=self.model)
        for block in _blocks(self.model):
            fully_shard(block, mesh=_mesh(self.group, self.device))
        fully_shard(self.model, mesh=_mesh(self.group, self.device))
        optim = cfg.actor_rollout_ref.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay
        )
        self.checkpointer = ShardedCheckpointer(self.model, self.optimizer, self.group, cfg.run_dir)

    def share(self, samples: list[Sample]) -> list[Sample]:
        """This rank's samples: its share of each mini-batch, mini-batch after mini-batch."""
        size = self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        part = size // self.world
        return [
            s
            for start in range(0, len(samples), size)
            for s in samples[start + self.rank * part : start + (self.rank + 1) * part]
        ]

    def step(self, samples: list[Sample], step: int, version: int) -> dict[str, float]:
        from asyncrl.consumers.grpo import group_advantages
        from asyncrl.consumers.schedule import set_step_lr
        from asyncrl.consumers.update import data_metrics, grpo_update, reward_metrics, reward_valid

        optim, total = self.cfg.actor_rollout_ref.actor.optim, self.cfg.trainer.total_training_steps
        set_step_lr(self.optimizer, optim, step, total)
        metrics = grpo_update(
            *(self.model, self.optimizer, self.share(samples), self.local_cfg, self.device),
            pad_token_id=self.tokenizer.pad_token_id,
            version=version,
            ref_model=self.ref_model,
            group=self.group,
        )
        rewards = torch.tensor([s.rewards for s in samples], dtype=torch.float32)
        norm_by_std = self.cfg.algorithm.norm_adv_by_std_in_grpo
        advantages = group_advantages(rewards, norm_by_std, valid=reward_valid(samples))
        metrics.update(data_metrics(samples, advantages, self.cfg))
        metrics.update(reward_metrics(samples))
        return metrics

    def full_state_dict(self) -> dict[str, Any]:
        """The whole policy's weights, gathered into host memory on rank 0 ({} elsewhere).
        Every rank calls it (a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def snapshot(self, state: TrainerState) -> ShardedSnapshot:
        """This rank's shards of the checkpoint of ``state.step`` (``consumers/fsdp_checkpoint.py``);
        every rank calls it at the same step."""
        return self.checkpointer.snapshot(state)

    def load(self, path: Path) -> TrainerState:
        """The checkpoint at ``path`` (sharded by any rank count, or one process's) into this
        rank's shards; every rank calls it."""
        return self.checkpointer.load(path)


def broadcast_samples(
    samples: list[Sample] | None, group: dist.ProcessGroup | None = None, src: int = 0
) -> list[Sample]:
    """A step's samples from rank ``src`` (which passes them) to every rank of ``group`` (which
    pass None), as the Arrow records the ``samples`` topic carries (``schemas/sample.py``):
    decoded, never unpickled. Every rank calls it (a collective); all get the samples in
    ``src``'s order."""
    from asyncrl.schemas.sample import decode_sample, encode_sample

    blobs = [encode_sample(s) for s in samples] if samples is not None else []
    count = torch.tensor([len(blobs)], dtype=torch.int64)
    dist.broadcast(count, src=src, group=group)
    sizes = torch.tensor([len(b) for b in blobs] or [0] * int(count), dtype=torch.int64)
    dist.broadcast(sizes, src=src, group=group)
    data = (
        torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
        if samples is not None
        else torch.empty(int(sizes.sum()), dtype=torch.uint8)
    )
    dist.broadcast(data, src=src, group=group)
    if samples is not None:
        return samples
    raw, out, at = data.numpy().tobytes(), [], 0
    for size in sizes.tolist():
        out.append(decode_sample(raw[at : at + size]))
        at += size
    return out


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (its transformer layers): each one FSDP unit."""
    return [
        block
        for module in model.modules()
        if isinstance(module, torch.nn.ModuleList)
        for block in module
    ]


def _mesh(group: Any, device: torch.device) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device.type)
