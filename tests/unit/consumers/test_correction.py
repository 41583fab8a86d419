"""Off-policy corrections against values worked out by hand, on two tokens (issue 17).

The running example, one trajectory of two response tokens:

    proximal (trainer, before the step)  p = [-1.0, -0.5]
    behaviour (rollout, recorded)        b = [-1.2, -0.2]      lr = p - b = [0.2, -0.3]
    current policy                       logp = [-0.9, -0.6]   r = exp(logp - p) = [e^0.1, e^-0.1]

Token weights w = exp(lr) = [e^0.2, e^-0.3] = [1.2214, 0.7408]; the sequence weight is
exp(0.2 - 0.3) = e^-0.1 = 0.9048 on both tokens. Semantics: verl's rollout_corr_helper.py and
compute_policy_loss_vanilla (volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7).
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.config.offpolicy import RolloutCorrectionConfig
from asyncrl.consumers.correction import (
    importance_weights,
    offpolicy_metrics,
    rejection_mask,
    rollout_correction,
    stale_token_mask,
)
from asyncrl.consumers.grpo import policy_loss

E = math.exp
P = torch.tensor([[-1.0, -0.5]], dtype=torch.float64)
B = torch.tensor([[-1.2, -0.2]], dtype=torch.float64)
LR = P - B
M = torch.ones((1, 2), dtype=torch.float64)


def test_token_weights_are_exp_of_the_log_ratio_with_verls_metrics():
    w, m = importance_weights(LR, M, "token", 2.0)
    assert w[0].tolist() == pytest.approx([E(0.2), E(-0.3)])
    assert m["rollout_is_mean"] == pytest.approx((E(0.2) + E(-0.3)) / 2)
    assert (m["rollout_is_max"], m["rollout_is_min"]) == pytest.approx((E(0.2), E(-0.3)))
    assert m["rollout_is_ratio_fraction_high"] == m["rollout_is_ratio_fraction_low"] == 0.0
    # two values: population std is half their distance; ESS = mean(w)^2 / mean(w^2)
    assert m["rollout_is_std"] == pytest.approx((E(0.2) - E(-0.3)) / 2)
    mean, mean_sq = (E(0.2) + E(-0.3)) / 2, (E(0.4) + E(-0.6)) / 2
    assert m["rollout_is_eff_sample_size"] == pytest.approx(mean**2 / mean_sq, rel=1e-6)
    assert not w.requires_grad


def test_truncation_caps_weights_and_counts_both_tails():
    # C = 1.2: e^0.2 = 1.2214 > 1.2 is truncated; e^-0.3 = 0.7408 < 1/1.2 = 0.8333 is low
    w, m = importance_weights(LR, M, "token", 1.2)
    assert w[0].tolist() == pytest.approx([1.2, E(-0.3)])
    assert m["rollout_is_ratio_fraction_high"] == 0.5
    assert m["rollout_is_ratio_fraction_low"] == 0.5
    assert m["rollout_is_max"] == pytest.approx(E(0.2))  # measured before truncation
    # edge: a weight equal to C is neither truncated nor counted high (verl: strictly above)
    w, m = importance_weights(torch.zeros((1, 2), dtype=torch.float64), M, "token", 1.0)
    assert w[0].tolist() == [1.0, 1.0]
    assert m["rollout_is_ratio_fraction_high"] == m["rollout_is_ratio_fraction_low"] == 0.0


def test_sequence_weight_is_the_product_over_the_trained_tokens():
    w, m = importance_weights(LR, M, "sequence", 2.0)
    assert w[0].tolist() == pytest.approx([E(-0.1), E(-0.1)])
    assert m["rollout_is_max"] == m["rollout_is_min"] == pytest.approx(E(-0.1))
    # masked tokens do not enter the product, and get weight 0
    half = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    w, _ = importance_weights(LR, half, "sequence", 2.0)
    assert w[0].tolist() == pytest.approx([E(0.2), 0.0])
    # truncation of the sequence weight: e^0.2 -> 1.1
    w, m = importance_weights(LR, half, "sequence", 1.1)
    assert w[0, 0].item() == pytest.approx(1.1)
    assert m["rollout_is_ratio_fraction_high"] == 1.0


def test_batch_normalize_divides_by_the_truncated_mean():
    w, m = importance_weights(LR, M, "token", 1.2, batch_normalize=True)
    mean = (1.2 + E(-0.3)) / 2
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(mean)
    assert w[0].tolist() == pytest.approx([1.2 / mean, E(-0.3) / mean])


def test_decoupled_loss_weights_the_clipped_surrogate_against_the_proximal_policy():
    """l_t = w_t * max(-A r_t, -A clip(r_t, 0.8, 1.2)); r = [e^0.1, e^-0.1], nothing clipped,
    so l = [-e^0.1 e^0.2, -e^-0.1 e^-0.3] and the token mean is -(e^0.3 + e^-0.4) / 2."""
    logp = torch.tensor([[-0.9, -0.6]], dtype=torch.float64, requires_grad=True)
    w, _ = importance_weights(LR, M, "token", 2.0)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, metrics = policy_loss(logp, P, adv, M, 0.2, is_weights=w)
    assert loss.item() == pytest.approx(-(E(0.3) + E(-0.4)) / 2)
    assert metrics["ppo_kl"] == pytest.approx(0.0)  # mean(p - logp) = (-0.1 + 0.1) / 2
    # the weights are constants: d l / d logp_t = -w_t r_t / 2
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-E(0.3) / 2, -E(-0.4) / 2])
    # without weights: the plain clipped loss, -(e^0.1 + e^-0.1) / 2
    plain, _ = policy_loss(logp.detach(), P, adv, M, 0.2)
    assert plain.item() == pytest.approx(-(E(0.1) + E(-0.1)) / 2)


def test_decoupled_loss_where_the_ratio_is_clipped():
    """logp = [-0.5, -0.6]: r_1 = e^0.5 = 1.65 is clipped to 1.2 (its gradient 0), so
    l = [-1.2 e^0.2, -e^-0.4]."""
    logp = torch.tensor([[-0.5, -0.6]], dtype=torch.float64, requires_grad=True)
    w, _ = importance_weights(LR, M, "token", 2.0)
    loss, metrics = policy_loss(logp, P, torch.tensor([1.0]), M, 0.2, is_weights=w)
    assert loss.item() == pytest.approx(-(1.2 * E(0.2) + E(-0.4)) / 2)
    assert metrics["pg_clipfrac"] == 0.5
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -E(-0.4) / 2])


def _rs(option: str, threshold: float | str) -> RolloutCorrectionConfig:
    return RolloutCorrectionConfig(rollout_rs=option, rollout_rs_threshold=threshold)


def test_token_k1_rejection_keeps_the_ratio_band():
    """k1 = -lr = [-0.2, 0.3]; threshold 1.25 means the band [log 0.8, log 1.25] = +-0.223:
    the second token is outside and leaves the loss."""
    mask, m = rejection_mask(LR, M, _rs("token_k1", 1.25))
    assert mask[0].tolist() == [1.0, 0.0]
    assert m["rollout_rs_masked_fraction"] == 0.5
    assert m["rollout_rs_seq_masked_fraction"] == 1.0
    assert m["rollout_rs_token_k1_mean"] == pytest.approx(0.05)
    assert (m["rollout_rs_token_k1_max"], m["rollout_rs_token_k1_min"]) == pytest.approx(
        (0.3, -0.2)
    )
    assert m["rollout_rs_token_k1_fraction_high"] == 0.5
    assert m["rollout_rs_token_k1_fraction_low"] == 0.0
    # explicit bounds "lower_upper": [log 0.7, log 1.5] keeps both
    mask, _ = rejection_mask(LR, M, _rs("token_k1", "0.7_1.5"))
    assert mask[0].tolist() == [1.0, 1.0]


def test_k2_thresholds_keep_the_edge_and_sequence_options_reject_whole_rows():
    """lr = [0.5, -1.0] (row 0) and [0, 0] (row 1): k2 = lr^2 / 2 = [0.125, 0.5] and [0, 0],
    exact in binary, so the edge is exact: a statistic equal to the threshold is kept."""
    lr = torch.tensor([[0.5, -1.0], [0.0, 0.0]], dtype=torch.float64)
    ones = torch.ones((2, 2), dtype=torch.float64)
    mask, _ = rejection_mask(lr, ones, _rs("token_k2", 0.5))
    assert mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    mask, m = rejection_mask(lr, ones, _rs("token_k2", 0.4999))
    assert mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert m["rollout_rs_masked_fraction"] == 0.25
    assert m["rollout_rs_seq_masked_fraction"] == 0.5
    # row 0 sums to 0.625: kept at 0.625, the whole row rejected below it
    mask, _ = rejection_mask(lr, ones, _rs("seq_sum_k2", 0.625))
    assert mask.tolist() == ones.tolist()
    mask, m = rejection_mask(lr, ones, _rs("seq_sum_k2", 0.6))
    assert mask.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert m["rollout_rs_seq_sum_k2_max"] == 0.625
    assert m["rollout_rs_seq_sum_k2_seq_masked_fraction"] == 0.5
    # max over the row: 0.5; mean: 0.3125
    mask, _ = rejection_mask(lr, ones, _rs("seq_max_k2", 0.49))
    assert mask.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    mask, _ = rejection_mask(lr, ones, _rs("seq_mean_k2", 0.3125))
    assert mask.tolist() == ones.tolist()
    # k3 = exp(lr) - 1 - lr: row 0 token 2 is e^-1 = 0.3679; options chain with AND
    mask, _ = rejection_mask(lr, ones, _rs("token_k3,seq_mean_k2", "0.3,10"))
    assert mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_rejection_ignores_masked_tokens():
    """A token already out of the loss (a tool token, a failed reward) takes no part: row 0's
    second token has k2 = 0.5 but is masked, so seq_max_k2 sees 0.125 only."""
    lr = torch.tensor([[0.5, -1.0]], dtype=torch.float64)
    half = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    mask, m = rejection_mask(lr, half, _rs("seq_max_k2", 0.2))
    assert mask.tolist() == [[1.0, 0.0]]
    assert m["rollout_rs_masked_fraction"] == 0.0


def test_mismatch_metrics_of_the_example():
    m = offpolicy_metrics(P, B, M)
    assert m["kl"] == pytest.approx(0.05)  # mean(b - p) = (-0.2 + 0.3) / 2
    assert m["k3_kl"] == pytest.approx(((E(0.2) - 1.2) + (E(-0.3) - 0.7)) / 2)
    assert m["training_ppl"] == pytest.approx(E(0.75))
    assert m["rollout_ppl"] == pytest.approx(E(0.7))
    assert m["log_ppl_diff"] == pytest.approx(0.05)  # mean b - mean p = -0.7 + 0.75
    assert m["ppl_ratio"] == pytest.approx(E(0.05))
    assert m["chi2_token"] == pytest.approx((E(0.4) + E(-0.6)) / 2 - 1)
    assert m["chi2_seq"] == pytest.approx(E(-0.2) - 1)
    same = offpolicy_metrics(P, P, M)
    assert same["kl"] == same["k3_kl"] == same["chi2_token"] == same["chi2_seq"] == 0.0


def test_rollout_correction_prefixes_verls_names_and_shares_the_input_mask():
    cfg = RolloutCorrectionConfig(
        rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=1.25
    )
    out = rollout_correction(P, B, M, cfg)
    assert out.response_mask[0].tolist() == [1.0, 0.0]
    assert out.weights is not None and out.weights[0].tolist() == pytest.approx([E(0.2), E(-0.3)])
    for name in ("rollout_is_mean", "rollout_rs_masked_fraction", "kl", "k3_kl", "chi2_seq"):
        assert f"rollout_corr/{name}" in out.metrics
    # metrics only (compute_prox_log_prob without rollout_is/rs): no weights, mask unchanged
    bare = rollout_correction(P, B, M, RolloutCorrectionConfig())
    assert bare.weights is None and torch.equal(bare.response_mask, M)
    assert set(bare.metrics) >= {"rollout_corr/kl", "rollout_corr/training_ppl"}


def test_stale_tokens_are_masked_per_segment_or_the_trajectory_dropped():
    """Trajectory of 4 tokens: segment [0, 2) under version 1, [2, 4) under version 3 (a
    partial rollout). The trainer is at 4; max lag 1: the first segment (lag 3) is too old."""
    from asyncrl.schemas.sample import Trajectory

    t = Trajectory(
        [5, 6, 7, 8],
        [-1.0] * 4,
        1.0,
        param_version_start=1,
        param_version=3,
        segment_starts=[0, 2],
        segment_versions=[1, 3],
    )
    assert t.token_versions().tolist() == [1, 1, 3, 3]
    rows = [t.token_versions(), [4, 4]]  # a fresh 2-token trajectory beside it
    assert stale_token_mask(rows, 5, 4, 1, "mask").tolist() == [
        [0.0, 0.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 1.0, 1.0, 1.0],
    ]
    assert stale_token_mask(rows, 4, 4, 1, "drop").tolist()[0] == [0.0] * 4
    assert stale_token_mask(rows, 4, 4, 3, "mask").tolist()[0] == [1.0] * 4  # lag 3 <= 3


def test_config_checks_name_the_key():
    with pytest.raises(ConfigError, match="needs algorithm.rollout_correction.rollout_rs_thr"):
        load_config(
            overrides=[
                "async_training.compute_prox_log_prob=true",
                "algorithm.rollout_correction.rollout_rs=token_k1",
            ]
        )
    with pytest.raises(ConfigError, match="rollout_rs='token_k9'"):
        load_config(
            overrides=[
                "async_training.compute_prox_log_prob=true",
                "algorithm.rollout_correction.rollout_rs=token_k9",
                "algorithm.rollout_correction.rollout_rs_threshold=2",
            ]
        )
    with pytest.raises(ValueError, match="seq_sum_k2: .0.5_2. is not a positive bound"):
        RolloutCorrectionConfig(rollout_rs="seq_sum_k2", rollout_rs_threshold="0.5_2")
    with pytest.raises(ConfigError, match="need async_training.compute_prox_log_prob=true"):
        load_config(overrides=["algorithm.rollout_correction.rollout_is=token"])
    cfg = RolloutCorrectionConfig(
        rollout_rs="token_k1,seq_max_k3", rollout_rs_threshold="0.5_2.0,4"
    )
    assert cfg.rs_thresholds() == {
        "token_k1": (math.log(0.5), math.log(2.0)),
        "seq_max_k3": (None, 4.0),
    }
