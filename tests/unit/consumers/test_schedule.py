"""verl's learning-rate warm-up and schedules, a function of the step (consumers/schedule.py),
against values worked out by hand, and through the config keys verl's scripts set."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.consumers.schedule import lr_factor, set_step_lr, warmup_steps


def _optim(*overrides: str):
    keys = [f"actor_rollout_ref.actor.optim.{o}" for o in overrides]
    return load_config(overrides=keys).actor_rollout_ref.actor.optim


def test_the_default_is_the_constant_rate_from_the_first_step():
    optim = _optim()
    assert [lr_factor(optim, i, 100) for i in range(3)] == [1.0, 1.0, 1.0]


def test_a_linear_warm_up_from_zero_then_constant():
    """verl's DAPO script: lr_warmup_steps=10; step k (1-based) trains at lr * (k - 1) / 10."""
    optim = _optim("lr_warmup_steps=10", "lr=1e-6")
    assert [lr_factor(optim, i, 100) for i in (0, 1, 5, 10, 50)] == [0.0, 0.1, 0.5, 1.0, 1.0]
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert set_step_lr(opt, optim, step=4, total_steps=100) == pytest.approx(3e-7)
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-7)


def test_the_warm_up_as_a_share_of_the_run():
    optim = _optim("lr_warmup_steps_ratio=0.1")
    assert warmup_steps(optim, 200) == 20
    assert warmup_steps(_optim("lr_warmup_steps=3", "lr_warmup_steps_ratio=0.5"), 200) == 3


def test_a_cosine_decay_to_the_floor():
    """Warm-up 10 from the floor 0.1, then half a cosine over the other 90 steps:
    factor = 0.1 + 0.9 * (1 + cos(pi * progress)) / 2."""
    optim = _optim("lr_warmup_steps=10", "lr_scheduler_type=cosine", "min_lr_ratio=0.1")
    assert lr_factor(optim, 0, 100) == pytest.approx(0.1)
    assert lr_factor(optim, 5, 100) == pytest.approx(0.55)
    assert lr_factor(optim, 10, 100) == pytest.approx(1.0)
    assert lr_factor(optim, 55, 100) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 2)) / 2)
    assert lr_factor(optim, 100, 100) == pytest.approx(0.1)


def test_verls_older_warmup_style_name_loads():
    assert _optim("warmup_style=cosine").lr_scheduler_type == "cosine"
    assert _optim("warmup_style=null").lr_scheduler_type == "constant"
