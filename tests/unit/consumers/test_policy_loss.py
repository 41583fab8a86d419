"""The PPO loss's clip ranges and dual clip (verl's clip_ratio_low/high/c), against values
worked out by hand on two tokens with old log-probs 0, so each token's ratio is exp(logp)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.consumers.grpo import policy_loss

M = torch.ones((1, 2), dtype=torch.float64)
OLD = torch.zeros((1, 2), dtype=torch.float64)


def _logp(*ratios: float) -> torch.Tensor:
    return torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)


def _loss(ratios, advantage, clip, clip_ratio_c=None):
    logp = _logp(*ratios)
    adv = torch.tensor([advantage], dtype=torch.float64)
    loss, metrics = policy_loss(logp, OLD, adv, M, clip, clip_ratio_c=clip_ratio_c)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), metrics


def test_clip_higher_lets_a_good_answers_unlikely_token_gain_more():
    """A = +1, ratios [1.25, 0.75]. Symmetric 0.2: 1.25 is clipped to 1.2 (gradient 0), 0.75
    is not (below 1 only a negative advantage clips): l = -(1.2 + 0.75) / 2. (0.2, 0.28): 1.25
    is inside, l = -(1.25 + 0.75) / 2 and its gradient -1.25 / 2."""
    loss, grad, metrics = _loss([1.25, 0.75], 1.0, 0.2)
    assert loss == pytest.approx(-(1.2 + 0.75) / 2)
    assert grad == pytest.approx([0.0, -0.75 / 2])
    assert metrics["pg_clipfrac"] == 0.5
    loss, grad, metrics = _loss([1.25, 0.75], 1.0, (0.2, 0.28))
    assert loss == pytest.approx(-(1.25 + 0.75) / 2)
    assert grad == pytest.approx([-1.25 / 2, -0.75 / 2])
    assert metrics["pg_clipfrac"] == 0.0


def test_clip_low_bounds_a_bad_answers_token_from_below():
    """A = -1, ratio 0.75 on both tokens: l = max(0.75, clip(0.75)) is 0.8 (clipped, gradient
    0) at clip_ratio_low 0.2, and 0.75 (inside, gradient 0.75 / 2) at 0.3, whatever the high."""
    loss, grad, _ = _loss([0.75, 0.75], -1.0, (0.2, 5.0))
    assert loss == pytest.approx(0.8) and grad == pytest.approx([0.0, 0.0])
    loss, grad, _ = _loss([0.75, 0.75], -1.0, (0.3, 0.01))
    assert loss == pytest.approx(0.75) and grad == pytest.approx([0.375, 0.375])


def test_dual_clip_bounds_the_loss_of_a_negative_advantage():
    """A = -1, ratios [5, 2]: the clipped surrogate is max(r, 1.2) = [5, 2]. With c = 3 the
    first is bounded to 3 (gradient 0, counted in pg_clipfrac_lower), the second is below the
    bound and keeps its gradient r / 2 = 1. Without dual clip, [5, 2] and gradients [2.5, 1]."""
    loss, grad, metrics = _loss([5.0, 2.0], -1.0, 0.2, clip_ratio_c=3.0)
    assert loss == pytest.approx((3.0 + 2.0) / 2)
    assert grad == pytest.approx([0.0, 1.0])
    assert metrics["pg_clipfrac_lower"] == 0.5
    loss, grad, metrics = _loss([5.0, 2.0], -1.0, 0.2)
    assert loss == pytest.approx((5.0 + 2.0) / 2)
    assert grad == pytest.approx([2.5, 1.0])
    assert metrics["pg_clipfrac_lower"] == 0.0


def test_dual_clip_leaves_a_positive_advantage_alone():
    loss, grad, metrics = _loss([5.0, 1.0], 1.0, 0.2, clip_ratio_c=3.0)
    assert loss == pytest.approx(-(1.2 + 1.0) / 2)
    assert grad == pytest.approx([0.0, -0.5])
    assert metrics["pg_clipfrac_lower"] == 0.0


def test_verls_clip_keys_load_and_reach_the_loss():
    """DAPO's clip-higher, as verl's scripts write it; clip_ratio sets a side left unset."""
    actor = load_config(
        overrides=[
            "actor_rollout_ref.actor.clip_ratio_low=0.2",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.actor.clip_ratio_c=10.0",
        ],
    ).actor_rollout_ref.actor
    assert actor.clip_range == (0.2, 0.28) and actor.clip_ratio_c == 10.0
    actor = load_config(
        overrides=[
            "actor_rollout_ref.actor.clip_ratio=0.3",
            "actor_rollout_ref.actor.clip_ratio_high=0.4",
        ],
    ).actor_rollout_ref.actor
    assert actor.clip_range == (0.3, 0.4)
    default = load_config().actor_rollout_ref.actor
    assert default.clip_range == (0.2, 0.2) and default.clip_ratio_c == 3.0  # verl's defaults
    assert (
        load_config(
            overrides=["actor_rollout_ref.actor.clip_ratio_c=null"]
        ).actor_rollout_ref.actor.clip_ratio_c
        is None
    )
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.clip_ratio_c"):
        load_config(overrides=["actor_rollout_ref.actor.clip_ratio_c=1.0"])  # verl: must be > 1


X = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)  # row 3: no token


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3) / 3),
        ("seq-mean-token-mean", ((1 + 2) / 2 + 3) / 2),
        ("seq-mean-token-sum", ((1 + 2) + 3) / 2),
        ("seq-mean-token-sum-norm", (1 + 2 + 3) / 4),  # scale 4
    ],
)
def test_verls_four_loss_aggregations_and_their_micro_batch_split(mode, expected):
    from asyncrl.consumers.grpo import aggregate, aggregate_norm

    norm = aggregate_norm(MASK, mode, scale=4)
    assert aggregate(X, MASK, mode, norm).item() == pytest.approx(expected)
    # a row at a time with the whole batch's denominator adds up to the whole
    parts = sum(aggregate(X[i : i + 1], MASK[i : i + 1], mode, norm).item() for i in range(3))
    assert parts == pytest.approx(expected)


def test_seq_mean_token_sum_norm_divides_by_the_padded_width_without_a_scale():
    from asyncrl.consumers.grpo import aggregate

    assert aggregate(X, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(6 / 3)


def test_the_loss_scale_factor_loads():
    actor = load_config(
        overrides=[
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
            "actor_rollout_ref.actor.loss_scale_factor=512",
        ],
    ).actor_rollout_ref.actor
    assert actor.loss_agg_mode == "seq-mean-token-sum-norm" and actor.loss_scale_factor == 512
