"""The trainer's side of the ``sim`` engine (benchmarks): an update that only takes its time.

The policy is loaded and synced as in a real run; a step sleeps ``sim.train_s_per_sample`` per
sample and reports the batch statistics a real step reports, with no gradient. ``asyncrl train``
passes it to the trainer as its update backend when ``rollout.name=sim``.
"""

from __future__ import annotations

import time

import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.grpo import group_advantages
from asyncrl.consumers.local_update import LocalUpdate
from asyncrl.consumers.update import data_metrics, reward_metrics, reward_valid
from asyncrl.schemas.sample import Sample


def simulated_update(samples: list[Sample], cfg: RunConfig) -> dict[str, float]:
    """The modelled time of an update on ``samples``, and their batch statistics."""
    time.sleep(cfg.sim.train_s_per_sample * len(samples))
    rewards = torch.tensor([s.rewards for s in samples], dtype=torch.float32)
    advantages = group_advantages(
        rewards, cfg.algorithm.norm_adv_by_std_in_grpo, valid=reward_valid(samples)
    )
    return {**data_metrics(samples, advantages, cfg), **reward_metrics(samples)}


class SimulatedUpdate(LocalUpdate):
    """A one-process backend whose steps are :func:`simulated_update`."""

    learns = False

    def step(self, samples: list[Sample], step: int, version: int) -> dict[str, float]:
        return simulated_update(samples, self.cfg)
