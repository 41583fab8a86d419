"""Gradient accumulation over micro-batches (verl's ppo_micro_batch_size_per_gpu, and
use_dynamic_bsz with ppo_max_token_len_per_gpu): the same update as one pass over the whole
mini-batch, to float rounding, whatever the split."""

import copy
import random

import pytest
import torch

from asyncrl.config import ModelConfig, load_config
from asyncrl.consumers.grpo import build_batch, micro_batches
from asyncrl.consumers.update import grpo_update, policy_step
from asyncrl.models.tiny import build_model
from asyncrl.schemas.sample import Sample, Trajectory

VOCAB = 30


def _rows(n: int, seed: int = 0) -> list[tuple[list[int], list[int], list[float], float]]:
    """Trajectories of varied prompt (1-9) and response (0-12) lengths, recorded logprobs off
    the policy's (ratios away from 1, some clipped) and advantages of both signs."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = [1, *(rng.randrange(4, VOCAB) for _ in range(rng.randrange(9)))]
        response = [rng.randrange(4, VOCAB) for _ in range(rng.randrange(13))]
        logprobs = [-rng.uniform(1.0, 4.0) for _ in response]
        rows.append((prompt, response, logprobs, rng.uniform(-1.5, 1.5)))
    return rows


def _step(overrides: list[str], model, batch, **kwargs):
    cfg = load_config(overrides=overrides)
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the gradient
    metrics = policy_step(model, optimizer, batch, cfg, **kwargs)
    return model, metrics


def _assert_same_update(a, b, metrics_a, metrics_b):
    """Same weights after an SGD step (Adam's first step, ~lr x sign(g), would turn float
    rounding of a near-zero gradient into a whole step) and the same metrics."""
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=2e-6, rtol=0), name
    assert metrics_a.keys() == metrics_b.keys()
    for k in metrics_a:
        if not k.startswith("timing_s/"):
            assert metrics_b[k] == pytest.approx(metrics_a[k], abs=2e-6, rel=1e-5), k


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("rollout_logprobs", [True, False], ids=["recorded", "recomputed"])
@pytest.mark.parametrize(
    "micro",
    [
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40",
        ],
    ],
    ids=["3 rows", "1 row", "40 tokens"],
)
def test_micro_batches_make_the_whole_mini_batchs_update(agg, rollout_logprobs, micro):
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64), VOCAB, 0)
    batch = build_batch(_rows(10), pad_token_id=0)
    base = [
        f"actor_rollout_ref.actor.loss_agg_mode={agg}",
        f"async_training.use_rollout_log_probs={str(rollout_logprobs).lower()}",
    ]
    whole, m_whole = _step(base, model, batch)
    split, m_split = _step([*base, *micro], model, batch)
    if rollout_logprobs:  # recomputed, the ratios are 1
        assert m_whole["pg_clipfrac"] > 0  # clipping happened: the split must agree there too
    _assert_same_update(whole, split, m_whole, m_split)


def test_proximal_weights_are_split_with_their_rows():
    """Decoupled PPO's proximal log-probs and importance weights ([B, R], the mini-batch's
    columns) go to each micro-batch with its rows, cut to its columns."""
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64), VOCAB, 0)
    batch = build_batch(_rows(9, seed=1), pad_token_id=0)
    gen = torch.Generator().manual_seed(0)
    prox = batch.old_logprobs + 0.3 * torch.randn(batch.old_logprobs.shape, generator=gen)
    weights = torch.rand(batch.old_logprobs.shape, generator=gen) * 2
    kw = {"prox": prox * batch.response_mask, "is_weights": weights}
    whole, m_whole = _step([], model, batch, **kw)
    micro = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]
    split, m_split = _step(micro, model, batch, **kw)
    _assert_same_update(whole, split, m_whole, m_split)


def test_micro_batches_hold_each_row_once_cut_to_their_columns():
    batch = build_batch(_rows(17, seed=2), pad_token_id=0)
    lengths = batch.attention_mask.sum(-1).tolist()
    for size, tokens in ((5, None), (None, 30), (None, 1)):
        micro = micro_batches(batch, size, tokens)
        seen = sorted(i for index, _ in micro for i in index.tolist())
        assert seen == list(range(17))
        for index, b in micro:
            assert b.input_ids.shape[0] == len(index)
            assert b.attention_mask[:, 0].any()  # no column of padding alone on either side
            assert b.attention_mask[:, -1].any() or not b.response_mask.any()  # (or 1, empty)
            assert [int(x) for x in b.attention_mask.sum(-1)] == [lengths[i] for i in index]
            if size is not None:
                assert len(index) <= size
            elif len(index) > 1:
                assert b.input_ids.numel() <= tokens
    assert micro_batches(batch, None, None) == [(None, batch)]


def test_grpo_update_with_decoupled_ppo_is_the_same_split_or_whole():
    """The whole step (advantages, proximal log-probs computed in micro-batches, the rollout
    correction, the updates) with and without micro-batching."""
    rng = random.Random(3)
    samples = []
    for g in range(4):
        trajs = []
        for _ in range(4):
            prompt_ids, response, logprobs, _ = _rows(1, seed=rng.randrange(1000))[0]
            trajs.append(Trajectory(response, logprobs, float(rng.random() < 0.5)))
        samples.append(Sample(f"s{g}", f"p{g}", 0, prompt_ids, "1", trajs))
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64), VOCAB, 0)
    base = [
        "async_training.compute_prox_log_prob=true",
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    ]
    results = []
    for micro in ([], ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]):
        cfg = load_config(overrides=[*base, *micro])
        m = copy.deepcopy(model)
        optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        results.append((m, grpo_update(m, optimizer, samples, cfg, torch.device("cpu"))))
    (a, m_a), (b, m_b) = results
    _assert_same_update(a, b, m_a, m_b)


def test_verls_micro_batch_keys_set_asyncrls():
    cfg = load_config(overrides=["actor_rollout_ref.actor.ppo_micro_batch_size=4"])
    assert cfg.actor_rollout_ref.actor.micro_batching == (4, None)  # one trainer GPU
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # not used with it
        ]
    )
    assert cfg.actor_rollout_ref.actor.micro_batching == (None, 20480)
