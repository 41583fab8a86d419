"""The one-process update backend: the policy, its optimizer and reference policy on one device.

The weights, gradients and AdamW state are float32 on ``trainer.device``; the forward passes
compute in ``fsdp_config.dtype`` (``consumers/precision.py``). A step is ``grpo_update``
(``consumers/update.py``) after verl's learning-rate schedule (``consumers/schedule.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.checkpoint import Snapshot, TrainerState, load_checkpoint, snapshot
from asyncrl.models.policy import resolve_device
from asyncrl.schemas.sample import Sample


class LocalUpdate:
    learns = True

    def __init__(self, cfg: RunConfig, policy: tuple[torch.nn.Module, Any] | None = None):
        """``policy``: (model, tokenizer) to train; None: the run's (``load_policy``)."""
        from asyncrl.consumers.update import reference_policy
        from asyncrl.models.flat import flatten_parameters
        from asyncrl.models.warm_start import load_policy

        self.cfg = cfg
        self.device = resolve_device(cfg.trainer.device)
        torch.manual_seed(cfg.trainer.seed)
        self.model, self.tokenizer = policy or load_policy(cfg)
        self.model.to(self.device).train()
        # actor.use_kl_loss: the first policy, copied before a checkpoint is loaded over it
        self.ref_model = reference_policy(cfg, self.device, start=self.model)
        if self.device.type == "cuda":  # a worker on this GPU copies them in one piece
            flatten_parameters(self.model)
        optim = cfg.actor_rollout_ref.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay
        )

    def step(self, samples: list[Sample], step: int, version: int) -> dict[str, float]:
        from asyncrl.consumers.schedule import set_step_lr
        from asyncrl.consumers.update import grpo_update

        optim, total = self.cfg.actor_rollout_ref.actor.optim, self.cfg.trainer.total_training_steps
        set_step_lr(self.optimizer, optim, step, total)  # verl's warm-up and schedule
        return grpo_update(
            self.model,
            self.optimizer,
            samples,
            self.cfg,
            self.device,
            pad_token_id=self.tokenizer.pad_token_id,
            version=version,
            ref_model=self.ref_model,
        )

    def snapshot(self, state: TrainerState) -> Snapshot:
        return snapshot(self.model, self.optimizer, state)

    def load(self, path: Path) -> TrainerState:
        return load_checkpoint(path, self.model, self.optimizer)
