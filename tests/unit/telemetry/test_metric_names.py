"""A trainer step's metrics carry verl's names, with verl's meaning (no broker, no real run).

The names below are read from verl's code, github.com/volcengine/verl at commit
b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29); each group names the file that emits them.
docs/observability.md has the same list with what each one means here.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.bench.sim_update import simulated_update
from asyncrl.config import load_config
from asyncrl.consumers.step_stats import (
    STALE_SAMPLES,
    STALE_TRAJECTORIES,
    fully_async_metrics,
    param_sync_metrics,
    step_metrics,
)
from asyncrl.consumers.update import grpo_update
from asyncrl.schemas.sample import Sample, Trajectory
from asyncrl.telemetry.metrics import stale_in_step
from tests.helpers import SMALL_MODEL

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"

VERL_STEP_NAMES = {
    # verl/trainer/ppo/metric_utils.py, compute_data_metrics (use_critic=False)
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "response_length_non_aborted/mean",
    "response_length_non_aborted/max",
    "response_length_non_aborted/min",
    "response_length_non_aborted/clip_ratio",
    "response/aborted_ratio",
    "prompt_length/mean",
    "prompt_length/max",
    "prompt_length/min",
    "prompt_length/clip_ratio",
    "num_turns/min",
    "num_turns/max",
    "num_turns/mean",
    # verl/trainer/ppo/metric_utils.py, compute_timing_metrics ("timing_s/{name}" of the
    # trainer's marked_timer("step"), ("gen"), ("update_actor") in
    # verl/experimental/fully_async_policy/fully_async_trainer.py and ray_trainer.py)
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_per_token_ms/gen",
    "timing_per_token_ms/update_actor",
    # verl/trainer/ppo/metric_utils.py, compute_throughout_metrics
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
    # verl/workers/actor/dp_actor.py (update_policy), verl/trainer/ppo/core_algos.py
    # (compute_policy_loss_vanilla), verl/workers/fsdp_workers.py (update_actor: actor/lr)
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    # verl/experimental/fully_async_policy/fully_async_trainer.py (_collect_metrics_from_samples,
    # _get_samples_from_queue); the stale counts are running totals there
    "fully_async/count/stale_samples_processed",
    "fully_async/count/stale_trajectory_processed",
    "fully_async/count/current_param_version",
    "fully_async/total_wait_time",
    # verl/experimental/fully_async_policy/fully_async_rollouter.py (get_statistics:
    # "count/total_generated_samples", prefixed "fully_async/" in detach_utils.py)
    "fully_async/count/total_generated_samples",
    # verl/experimental/fully_async_policy/detach_utils.py (assemble_batch_from_rollout_samples)
    "fully_async/partial/total_partial_num",
    "fully_async/partial/partial_ratio",
    "fully_async/partial/max_partial_span",
    "fully_async/processing_time/avg",
    "fully_async/processing_time/max",
    "fully_async/processing_time/min",
    "fully_async/processing_time/tp50",
    "fully_async/processing_time/tp99",
    "fully_async/processing_time/tp95",
    "timing_s/agent_loop/tool_calls/max",
    "timing_s/agent_loop/tool_calls/min",
    "timing_s/agent_loop/tool_calls/mean",
    # verl/experimental/fully_async_policy/ray_trainer.py (_collect_metrics)
    "training/global_step",
}
VERL_SYNC_NAMES = {
    # verl/experimental/fully_async_policy/fully_async_trainer.py
    # (_trigger_parameter_sync_after_step: marked_timer("timing_s/param_sync"))
    "timing_s/param_sync",
}
OLD_NAMES = {
    "timing/step_s",
    "timing/sync_pause_s",
    "timing/sync_transfer_s",
    "agent/num_turns/mean",
    "agent/num_turns/max",
}

VOCAB = 16


def _traj(n_resp: int, reward: float, start: int = 0, end: int | None = None, **kw) -> Trajectory:
    ids = [3 + (i % (VOCAB - 3)) for i in range(n_resp)]
    return Trajectory(
        response_ids=ids,
        response_logprobs=[-1.0] * n_resp,
        reward=reward,
        param_version_start=start,
        param_version=start if end is None else end,
        **kw,
    )


def _sample(sid: str, prompt_len: int, trajs: list[Trajectory]) -> Sample:
    prompt = [3 + (i % (VOCAB - 3)) for i in range(prompt_len)]
    return Sample(sid, f"p-{sid}", 0, prompt, "0", trajs)


def _cfg(*overrides: str):
    return load_config(
        overrides=[
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "async_training.require_batches=1",
            "data.max_prompt_length=5",
            "data.max_response_length=6",
            *SMALL_MODEL,
            *overrides,
        ]
    )


def _batch() -> list[Sample]:
    """Two samples of two trajectories; the trainer is at version 2 when it trains them.

    s0: generated under version 1 (one step stale), a full-length response (6 = the max)
    and a 3-token one; s1: one trajectory under 2, one continued from 1 to 2 (partial).
    """
    return [
        _sample(
            "s0",
            5,
            [
                _traj(6, 1.0, 1, t_start=10.0, t_end=12.0, reward_s=0.5),
                _traj(3, 0.0, 1, t_start=10.0, t_end=11.0),
            ],
        ),
        _sample(
            "s1",
            3,
            [
                _traj(2, 1.0, 2, t_start=20.0, t_end=24.0, tool_s=1.0, num_turns=3, tool_calls=1),
                _traj(4, 0.0, 1, 2, t_start=20.0, t_end=21.0),
            ],
        ),
    ]


def _step(cfg, samples, totals, step=1, version=2):
    from asyncrl.models.tiny import build_model

    model = build_model(cfg.actor_rollout_ref.model, VOCAB, seed=0)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr)
    metrics = grpo_update(model, optim, samples, cfg, torch.device("cpu"))
    metrics.update(
        step_metrics(
            samples,
            step=step,
            version=version,
            totals=totals,
            timing_raw={"gen": 0.5, "update_actor": 1.5, "step": 2.0},
            n_devices=2,
            generated=7,
        )
    )
    return metrics


def test_a_step_carries_every_verl_name():
    cfg = _cfg()
    m = _step(cfg, _batch(), {})
    assert sorted(VERL_STEP_NAMES - m.keys()) == []
    assert sorted(OLD_NAMES & m.keys()) == []
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    sync = param_sync_metrics(0.3, 0.2, 0.05)
    assert sorted(VERL_SYNC_NAMES - sync.keys()) == []
    # the sim engine's trainer logs the batch's data metrics too
    sim = simulated_update(_batch(), _cfg("sim.train_s_per_sample=0"))
    assert {k for k in VERL_STEP_NAMES if k.split("/")[0] in ("critic", "num_turns")} <= set(sim)


def test_values_mean_what_verl_means():
    cfg = _cfg()
    m = _step(cfg, _batch(), {})
    # lengths per trajectory: responses 6, 3, 2, 4 (max 6); prompts 5, 5, 3, 3 (max 5)
    assert m["response_length/mean"] == pytest.approx(15 / 4)
    assert (m["response_length/max"], m["response_length/min"]) == (6.0, 2.0)
    assert m["response_length/clip_ratio"] == pytest.approx(0.25)
    assert m["prompt_length/mean"] == pytest.approx(4.0)
    assert m["prompt_length/clip_ratio"] == pytest.approx(0.5)
    assert m["response/aborted_ratio"] == 0.0
    # verl's agent loop counts the prompt: 2 for a single turn
    assert (m["num_turns/min"], m["num_turns/max"]) == (2.0, 4.0)
    assert m["critic/score/mean"] == pytest.approx(0.5)
    # tokens: 16 prompt + 15 response; 2 s step on 2 devices
    assert m["perf/total_num_tokens"] == 31.0
    assert m["perf/time_per_step"] == m["timing_s/step"] == 2.0
    assert m["perf/throughput"] == pytest.approx(31 / (2.0 * 2))
    assert m["timing_s/gen"] == m["fully_async/total_wait_time"] == 0.5
    assert m["timing_per_token_ms/gen"] == pytest.approx(500 / 15)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(1500 / 31)
    assert m["actor/lr"] == pytest.approx(cfg.actor_rollout_ref.actor.optim.lr)
    assert 0.0 < m["actor/entropy"] <= math.log(VOCAB) + 1e-6
    # per trajectory of the batch: one partial (span 1) of four
    assert m["fully_async/partial/total_partial_num"] == 1.0
    assert m["fully_async/partial/partial_ratio"] == pytest.approx(0.25)
    assert m["fully_async/partial/max_partial_span"] == 1.0
    # generation time: 2 - 0.5 (reward), 1, 4 - 1 (tool), 1
    assert m["fully_async/processing_time/max"] == pytest.approx(3.0)
    assert m["fully_async/processing_time/min"] == pytest.approx(1.0)
    assert m["fully_async/processing_time/avg"] == pytest.approx(6.5 / 4)
    assert m["fully_async/processing_time/tp50"] == pytest.approx(1.25)
    assert m["timing_s/agent_loop/tool_calls/max"] == 1.0
    assert m["fully_async/count/total_generated_samples"] == 7.0
    assert m["fully_async/count/current_param_version"] == 2.0
    assert m["training/global_step"] == 1.0


def test_stale_counts_are_verls_running_totals():
    """verl counts a sample stale when it finished under an older version (param_version_end),
    and adds each step's count to the run's total; asyncrl's staleness histogram (oldest
    token) stays per step."""
    totals: dict[str, float] = {}
    # step 1 at version 2: s0 (version 1) is stale; s1's partial ends under 2, so it is not
    m1 = fully_async_metrics(_batch(), 2, totals)
    assert m1[STALE_SAMPLES] == 1.0
    assert m1[STALE_TRAJECTORIES] == 2.0
    assert stale_in_step(m1) == 2  # by the oldest token, s1 is one version behind too
    # step 2 at version 3: both samples are stale now
    m2 = fully_async_metrics(_batch(), 3, totals)
    assert m2[STALE_SAMPLES] == 1.0 + 2.0
    assert m2[STALE_TRAJECTORIES] == 2.0 + 4.0
    assert stale_in_step(m2) == 2
    assert m2["fully_async/partial/total_partial_num"] == 1.0  # per batch, not a total
    # the totals live in the trainer's checkpointed history: a restarted trainer goes on
    restored = dict(totals)
    m3 = fully_async_metrics(_batch()[:1], 3, restored)
    assert m3[STALE_SAMPLES] == 4.0
    assert m3[STALE_TRAJECTORIES] == 8.0


def test_step_metrics_accumulate_across_steps():
    cfg = _cfg()
    totals: dict[str, float] = {}
    first = _step(cfg, _batch(), totals, step=1, version=2)
    second = _step(cfg, _batch(), totals, step=2, version=2)
    for key in (STALE_SAMPLES, STALE_TRAJECTORIES):
        assert second[key] == 2 * first[key] > 0
    assert second["training/global_step"] == 2.0


VERL_ROLLOUT_CORR_NAMES = {
    f"rollout_corr/{name}"
    for name in (
        # verl/trainer/ppo/rollout_corr_helper.py: compute_is_metrics (rollout_is=token)
        "rollout_is_mean",
        "rollout_is_max",
        "rollout_is_min",
        "rollout_is_std",
        "rollout_is_eff_sample_size",
        "rollout_is_ratio_fraction_high",
        "rollout_is_ratio_fraction_low",
        # compute_rollout_rejection_mask (rollout_rs=token_k1) and compute_rs_metrics
        "rollout_rs_masked_fraction",
        "rollout_rs_seq_masked_fraction",
        "rollout_rs_token_k1_masked_fraction",
        "rollout_rs_token_k1_seq_masked_fraction",
        "rollout_rs_token_k1_mean",
        "rollout_rs_token_k1_max",
        "rollout_rs_token_k1_min",
        "rollout_rs_token_k1_fraction_high",
        "rollout_rs_token_k1_fraction_low",
        # compute_offpolicy_metrics
        "training_ppl",
        "training_log_ppl",
        "kl",
        "k3_kl",
        "rollout_ppl",
        "rollout_log_ppl",
        "log_ppl_diff",
        "log_ppl_abs_diff",
        "log_ppl_diff_max",
        "log_ppl_diff_min",
        "ppl_ratio",
        "chi2_token",
        "chi2_seq",
    )
} | {
    # verl/trainer/ppo/ray_trainer.py: marked_timer("old_log_prob")
    "timing_s/old_log_prob",
}


def test_the_rollout_correction_carries_verls_names():
    cfg = _cfg(
        "async_training.compute_prox_log_prob=true",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=2.0",
    )
    m = _step(cfg, _batch(), {})
    assert sorted(VERL_ROLLOUT_CORR_NAMES - m.keys()) == []
    assert all(math.isfinite(m[k]) for k in VERL_ROLLOUT_CORR_NAMES)
    # off (the default): none of them
    assert not VERL_ROLLOUT_CORR_NAMES & _step(_cfg(), _batch(), {}).keys()
