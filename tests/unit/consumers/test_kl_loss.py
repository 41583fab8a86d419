"""verl's KL loss (actor.use_kl_loss) against the reference policy: the estimates by hand,
then a whole step on the tiny model, where the reference is the policy the step starts from."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from asyncrl.consumers.grpo import kl_penalty
from asyncrl.consumers.update import grpo_update
from tests.unit.consumers.test_offpolicy_update import _cfg, _model, _samples

LOGP = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -2.0]], dtype=torch.float64)  # logp - ref = [0.5, 0]


@pytest.mark.parametrize(
    "kind, first",
    [
        ("kl", 0.5),
        ("k1", 0.5),
        ("abs", 0.5),
        ("mse", 0.125),
        ("k2", 0.125),
        ("low_var_kl", math.exp(-0.5) + 0.5 - 1),  # r = ref - logp = -0.5: e^r - r - 1
        ("k3", math.exp(-0.5) + 0.5 - 1),
    ],
)
def test_kl_estimates_by_hand(kind, first):
    kl = kl_penalty(LOGP, REF, kind)
    assert kl[0].tolist() == pytest.approx([first, 0.0])


def test_low_var_kl_is_clamped_as_verls():
    far = kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "low_var_kl")
    assert far.item() == 10.0


def _step(cfg, model, ref):
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr)
    return grpo_update(model, optim, _samples(), cfg, torch.device("cpu"), ref_model=ref)


def test_a_step_with_the_kl_loss_starts_at_zero_and_grows_as_the_policy_moves():
    cfg = _cfg(
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.5",
        "actor_rollout_ref.actor.optim.lr=0.01",
    )
    model = _model(cfg)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    first = _step(cfg, model, ref)  # its first mini-batch sees the reference's own weights
    assert first["actor/kl_coef"] == 0.5
    second = _step(cfg, model, ref)
    assert 0 <= first["actor/kl_loss"] < second["actor/kl_loss"]
    with pytest.raises(ValueError, match="use_kl_loss needs the reference model"):
        _step(cfg, model, None)


def test_the_kl_loss_pulls_the_update_toward_the_reference():
    """Two steps from the same weights, with and without the KL term: they differ, and the
    one with it ends nearer the reference (its KL to it smaller)."""
    plain_cfg = _cfg("actor_rollout_ref.actor.optim.lr=0.05")
    kl_cfg = _cfg(
        "actor_rollout_ref.actor.optim.lr=0.05",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=50",
        "actor_rollout_ref.actor.kl_loss_type=k2",
    )
    plain, pulled = _model(plain_cfg), _model(kl_cfg)
    ref = copy.deepcopy(plain).eval().requires_grad_(False)
    for _ in range(3):
        _step(plain_cfg, plain, None)
        _step(kl_cfg, pulled, ref)

    def distance(m):
        pairs = zip(m.parameters(), ref.parameters(), strict=True)
        return sum(float((p - r).detach().square().sum()) for p, r in pairs)

    assert distance(pulled) < distance(plain)
