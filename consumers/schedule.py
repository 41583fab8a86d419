"""The learning rate of each training step: verl's warm-up and schedules (constant or cosine),
a function of the step alone, so a resumed trainer and ``asyncrl replay`` use the rate the
step had without a scheduler's state in the checkpoint.

verl steps its scheduler once per training step (``update_actor``), counting from 0; so does
asyncrl: step ``k`` (1-based, as the log numbers them) trains at ``lr * factor(k - 1)``. With a
warm-up, the first step's factor is 0 (or ``min_lr_ratio`` under cosine), as in verl.
"""

from __future__ import annotations

import math

import torch

from asyncrl.config.sections import OptimConfig


def warmup_steps(optim: OptimConfig, total_steps: int) -> int:
    """``lr_warmup_steps``, or where it is negative (verl's -1) ``lr_warmup_steps_ratio`` of
    the run's steps."""
    if optim.lr_warmup_steps >= 0:
        return optim.lr_warmup_steps
    return int(optim.lr_warmup_steps_ratio * total_steps)


def lr_factor(optim: OptimConfig, index: int, total_steps: int) -> float:
    """The factor on ``optim.lr`` after ``index`` earlier steps (verl's
    ``get_constant_schedule_with_warmup`` and ``get_cosine_schedule_with_warmup``)."""
    warmup = warmup_steps(optim, total_steps)
    floor = optim.min_lr_ratio if optim.lr_scheduler_type == "cosine" else 0.0
    if index < warmup:
        return floor + (1.0 - floor) * index / warmup
    if optim.lr_scheduler_type == "constant":
        return 1.0
    progress = (index - warmup) / max(1, total_steps - warmup)
    wave = math.cos(math.pi * optim.num_cycles * 2.0 * progress)
    return max(floor, wave * (1 - floor) * 0.5 + (1 + floor) * 0.5)


def set_step_lr(
    optimizer: torch.optim.Optimizer, optim: OptimConfig, step: int, total_steps: int
) -> float:
    """Set the rate training step ``step`` (1-based) uses; returns it."""
    lr = optim.lr * lr_factor(optim, step - 1, total_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
