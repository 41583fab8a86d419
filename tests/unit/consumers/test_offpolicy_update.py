"""A whole step with the off-policy options on (``grpo_update``), on the tiny model: the decoupled
objective reduces to PPO when behaviour and proximal policies agree, stale tokens leave the loss,
and the step's metrics carry verl's ``rollout_corr/*`` names."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.consumers.grpo import build_batch, token_logprobs
from asyncrl.consumers.update import grpo_update
from asyncrl.schemas.sample import Sample, Trajectory
from tests.helpers import SMALL_MODEL

VOCAB = 16


def _cfg(*overrides: str):
    return load_config(
        overrides=[
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "async_training.require_batches=2",
            *SMALL_MODEL,
            *overrides,
        ]
    )


def _samples(version: int = 0) -> list[Sample]:
    """Four samples of two trajectories (rewards 1 and 0: every group has a signal); the last
    trajectory of each is a partial rollout whose first two tokens came from version - 2."""
    out = []
    for g in range(4):
        trajs = [
            Trajectory(
                [3 + g, 4, 5],
                [-1.5, -2.0, -2.5],
                1.0,
                param_version_start=version,
                param_version=version,
            ),
            Trajectory(
                [6, 7 + g, 8, 9],
                [-2.2, -1.9, -2.1, -2.4],
                0.0,
                param_version_start=version - 2 if version >= 2 else version,
                param_version=version,
                segment_starts=[0, 2] if version >= 2 else [0],
                segment_versions=[version - 2, version] if version >= 2 else [version],
            ),
        ]
        out.append(Sample(f"s{g}", f"p{g}", 0, [1, 2 + g, 10], "0", trajs))
    return out


def _model(cfg):
    from asyncrl.models.tiny import build_model

    model = build_model(cfg.actor_rollout_ref.model, VOCAB, seed=0)
    model.train()
    return model


def _update(cfg, model, samples, version=None):
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr)
    return grpo_update(model, optim, samples, cfg, torch.device("cpu"), version=version)


def _as_rollout_of(model, samples, cfg) -> None:
    """Overwrite the recorded log-probs with the model's own, mini-batch by mini-batch as the
    update lays them out: the behaviour policy is then exactly the proximal one."""
    size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    temperature = cfg.actor_rollout_ref.rollout.temperature
    for start in range(0, len(samples), size):
        trajs = [t for s in samples[start : start + size] for t in s.trajectories]
        rows = [
            (s.prompt_ids, t.response_ids, t.response_logprobs, 0.0)
            for s in samples[start : start + size]
            for t in s.trajectories
        ]
        b = build_batch(rows, 0)
        with torch.no_grad():
            lp = token_logprobs(
                model, b.input_ids, b.attention_mask, b.position_ids, b.response_mask, temperature
            )
        for i, t in enumerate(trajs):
            t.response_logprobs = lp[i, : len(t.response_ids)].tolist()


def test_decoupled_ppo_is_ppo_when_the_rollout_is_the_proximal_policy():
    """Weights exp(p - b) = 1 exactly and r = exp(logp - p) = exp(logp - b): the same update,
    bit for bit, as the bypass (the rollout's log-probs as old_log_prob)."""
    bypass_cfg = _cfg()
    decoupled_cfg = _cfg(
        "async_training.compute_prox_log_prob=true",
        "algorithm.rollout_correction.rollout_is=token",
    )
    model = _model(bypass_cfg)
    samples = _samples()
    _as_rollout_of(model, samples, bypass_cfg)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    plain = _update(bypass_cfg, a, copy.deepcopy(samples))
    decoupled = _update(decoupled_cfg, b, copy.deepcopy(samples))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert decoupled["actor/pg_loss"] == plain["actor/pg_loss"]
    assert decoupled["rollout_corr/rollout_is_mean"] == 1.0
    assert decoupled["rollout_corr/kl"] == 0.0
    assert decoupled["timing_s/old_log_prob"] >= 0.0
    assert not any(k.startswith("rollout_corr/") for k in plain)


def test_a_stale_rollout_gets_weights_and_mismatch_metrics():
    cfg = _cfg(
        "async_training.compute_prox_log_prob=true",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_is_threshold=1.5",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5",
    )
    m = _update(cfg, _model(cfg), _samples())
    assert m["rollout_corr/kl"] != 0.0
    assert 0.0 <= m["rollout_corr/rollout_rs_masked_fraction"] <= 1.0
    assert m["rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-9
    assert {"actor/pg_loss", "actor/grad_norm", "rollout_corr/chi2_seq"} <= m.keys()


def test_tokens_older_than_the_lag_leave_the_loss():
    """At version 4, each sample's second trajectory has two tokens from version 2."""
    base = _cfg()
    samples = _samples(version=4)
    masked = _cfg("async_training.max_token_version_lag=1")
    m = _update(masked, _model(masked), copy.deepcopy(samples), version=4)
    # trainable tokens: 4 x (3 + 4); stale: 4 x 2, in 4 trajectories
    assert m["fully_async/stale_tokens/masked_ratio"] == pytest.approx(8 / 28)
    assert m["fully_async/stale_tokens/masked_trajectories"] == 4.0
    dropped = _cfg(
        "async_training.max_token_version_lag=1", "async_training.stale_token_action=drop"
    )
    m = _update(dropped, _model(dropped), copy.deepcopy(samples), version=4)
    assert m["fully_async/stale_tokens/masked_ratio"] == pytest.approx(16 / 28)
    # a lag every token exceeds: nothing to train, the weights stay as they were
    none_left = _cfg("async_training.max_token_version_lag=0")
    model = _model(none_left)
    before = copy.deepcopy(model.state_dict())
    m = _update(none_left, model, copy.deepcopy(_samples(version=0)), version=3)
    assert m["fully_async/stale_tokens/masked_ratio"] == 1.0
    assert "actor/pg_loss" not in m
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the option off: no version is needed and no stale_tokens metric appears
    assert not any("stale_tokens" in k for k in _update(base, _model(base), _samples(4)))
