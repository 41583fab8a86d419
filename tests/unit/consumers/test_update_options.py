"""verl's actor options that change a step's update: the entropy bonus (entropy_coeff) and
several passes over a step's mini-batches (ppo_epochs), on the tiny model."""

from __future__ import annotations

import copy

import torch

from asyncrl.consumers.grpo import build_batch, token_logprobs_and_entropy
from asyncrl.consumers.update import grpo_update
from asyncrl.schemas.sample import Sample, Trajectory
from tests.unit.consumers.test_offpolicy_update import _cfg, _model, _samples


def _step(cfg, model, samples, steps: int = 1):
    lr = cfg.actor_rollout_ref.actor.optim.lr
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        metrics = grpo_update(model, optim, samples, cfg, torch.device("cpu"))
    return metrics


def _no_signal() -> list[Sample]:
    """Every trajectory rewarded alike: GRPO advantages 0, no policy gradient at all."""
    return [
        Sample(
            f"s{g}",
            f"p{g}",
            0,
            [1, 2 + g, 10],
            "0",
            [Trajectory([3 + g, 4, 5], [-1.5, -2.0, -2.5], 1.0) for _ in range(2)],
        )
        for g in range(4)
    ]


def _entropy(model, samples) -> float:
    rows = [
        (s.prompt_ids, t.response_ids, t.response_logprobs, 0.0)
        for s in samples
        for t in s.trajectories
    ]
    b = build_batch(rows, 0)
    with torch.no_grad():
        _, h = token_logprobs_and_entropy(
            model, b.input_ids, b.attention_mask, b.position_ids, b.response_mask, 1.0
        )
    return float((h * b.response_mask).sum() / b.response_mask.sum())


def test_the_entropy_bonus_moves_a_policy_the_rewards_do_not():
    plain_cfg = _cfg("actor_rollout_ref.actor.optim.lr=0.001")
    bonus_cfg = _cfg(
        "actor_rollout_ref.actor.optim.lr=0.001", "actor_rollout_ref.actor.entropy_coeff=1"
    )
    plain, bonus = _model(plain_cfg), _model(bonus_cfg)
    start = copy.deepcopy(plain)
    _step(plain_cfg, plain, _no_signal())
    metrics = _step(bonus_cfg, bonus, _no_signal())
    same = zip(plain.parameters(), start.parameters(), strict=True)
    assert all(torch.equal(p, s) for p, s in same)  # no advantage, no bonus: no update
    assert _entropy(bonus, _no_signal()) > _entropy(start, _no_signal())
    penalty_cfg = _cfg(
        "actor_rollout_ref.actor.optim.lr=0.001", "actor_rollout_ref.actor.entropy_coeff=-1"
    )
    penalty = _model(penalty_cfg)
    _step(penalty_cfg, penalty, _no_signal())
    assert _entropy(penalty, _no_signal()) < _entropy(start, _no_signal())
    assert metrics["actor/entropy"] > 0


def test_ppo_epochs_pass_over_the_mini_batches_again_against_the_same_old_policy():
    """With the rollout's log-probs as the old policy, two epochs are two passes of the one
    step, bit for bit. With recomputed ones, the second pass keeps the first pass's (verl
    computes them once a step): not the same as a second step, which recomputes them."""
    recorded = [
        "actor_rollout_ref.actor.optim.lr=0.05",
        "async_training.use_rollout_log_probs=true",
    ]
    once, twice = _model(_cfg(*recorded)), _model(_cfg(*recorded))
    _step(_cfg(*recorded, "actor_rollout_ref.actor.ppo_epochs=2"), once, _samples())
    _step(_cfg(*recorded), twice, _samples(), steps=2)
    assert all(
        torch.equal(a, b) for a, b in zip(once.parameters(), twice.parameters(), strict=True)
    )

    fresh = ["actor_rollout_ref.actor.optim.lr=0.05", "async_training.use_rollout_log_probs=false"]
    epochs, steps = _model(_cfg(*fresh)), _model(_cfg(*fresh))
    _step(_cfg(*fresh, "actor_rollout_ref.actor.ppo_epochs=2"), epochs, _samples())
    _step(_cfg(*fresh), steps, _samples(), steps=2)
    pairs = zip(epochs.parameters(), steps.parameters(), strict=True)
    assert not all(torch.equal(a, b) for a, b in pairs)
