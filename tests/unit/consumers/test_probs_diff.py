"""verl's ``training/rollout_probs_diff_*``: each step's gap between the probabilities the
rollout engine recorded and the trainer's recomputation, on a real engine's samples."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.consumers.probs_diff import NAMES, probs_diff, probs_diff_metrics
from asyncrl.consumers.update import grpo_update
from asyncrl.models.tiny import build_model
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.cached import CachedHFEngine
from asyncrl.schemas.sample import Sample, Trajectory
from tests.helpers import SMALL_MODEL

VOCAB = 16
MAX, MEAN, STD = NAMES


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


def _rollout(model, temperature: float) -> list[Sample]:
    """Four prompts, two trajectories each, sampled by the hf_cached engine from ``model``."""
    engine = CachedHFEngine(model, None, temperature, eos_token_id=-1, pad_token_id=0, seed=1)
    prompts = [[1, 2 + g, 10, 3 + g] for g in range(4)]
    reqs = [GenRequest(f"{g}-{i}", p, 6) for g, p in enumerate(prompts) for i in range(2)]
    done = {r.request_id: r for r in engine.generate(reqs)}
    return [
        Sample(
            f"s{g}",
            f"p{g}",
            0,
            p,
            "0",
            [
                Trajectory(done[f"{g}-{i}"].response_ids, done[f"{g}-{i}"].response_logprobs, i)
                for i in range(2)
            ],
        )
        for g, p in enumerate(prompts)
    ]


def _step(cfg, model, samples) -> dict[str, float]:
    model = copy.deepcopy(model).train()
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr)
    return grpo_update(model, optim, samples, cfg, torch.device("cpu"))


def test_the_statistics_are_verls():
    """max, mean and torch.std (unbiased) of |exp(rollout) - exp(trainer)| over the masked
    tokens, gathered over mini-batches."""
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.3, 0.3]]))
    rollout = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.1, 0.35, 0.7]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    want = (rollout.exp() - trainer.exp()).abs()[mask.bool()]
    got = probs_diff_metrics(
        [
            probs_diff(trainer[:1], rollout[:1], mask[:1]),
            probs_diff(trainer[1:], rollout[1:], mask[1:]),
        ]
    )
    assert got[MAX] == pytest.approx(0.4)  # the masked 0.8 is left out
    assert got[MEAN] == pytest.approx(float(want.mean()))
    assert got[STD] == pytest.approx(float(torch.std(want)))
    assert probs_diff_metrics([]) == {}


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "async_training.use_rollout_log_probs=false",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        ],
        ["async_training.compute_prox_log_prob=true"],
        [
            "async_training.use_rollout_log_probs=false",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_epochs=2",
        ],
    ],
    ids=["old-log-probs", "proximal", "two-epochs"],
)
def test_a_step_that_recomputes_reports_the_engines_gap(overrides):
    """hf_cached's samples, trained from the weights that sampled them (fp32): the gap is float
    noise; the same tokens recorded at half their probability show a gap of half of it. (The
    old log-probs are recomputed per mini-batch, after the earlier ones' optimizer steps: one
    mini-batch, so that they are the sampling weights'; the proximal ones are all taken
    before the first step.)"""
    cfg = _cfg("actor_rollout_ref.rollout.temperature=0.7", *overrides)
    model = build_model(cfg.actor_rollout_ref.model, VOCAB, seed=0).eval()
    samples = _rollout(model, 0.7)
    exact = _step(cfg, model, samples)
    print(f"\nhf_cached, fp32 CPU: gap max {exact[MAX]:.1e} mean {exact[MEAN]:.1e}")
    assert exact[MAX] < 1e-6
    for s in samples:
        for t in s.trajectories:
            t.response_logprobs = t.response_logprobs + float(torch.log(torch.tensor(0.5)))
    halved = _step(cfg, model, samples)
    probs = torch.cat(
        [torch.tensor(t.response_logprobs).exp() for s in samples for t in s.trajectories]
    )
    assert halved[MAX] == pytest.approx(float(probs.max()), abs=1e-5)
    assert halved[MEAN] == pytest.approx(float(probs.mean()), abs=1e-5)
    assert halved[STD] == pytest.approx(float(probs.std()), abs=1e-5)


def test_a_step_on_the_rollouts_own_log_probs_has_no_gap_to_report():
    """use_rollout_log_probs (the default) and no proximal log-probs: nothing recomputed."""
    cfg = _cfg()
    model = build_model(cfg.actor_rollout_ref.model, VOCAB, seed=0).eval()
    assert not set(NAMES) & set(_step(cfg, model, _rollout(model, 1.0)))
