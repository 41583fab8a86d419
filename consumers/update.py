"""One local update ("step") of the policy on a batch of samples: GRPO, verl's layout.

A step holds ``require_batches`` mini-batches of ``ppo_mini_batch_size`` samples; each
mini-batch is one optimizer step, as in verl's actor update. Advantages are computed per
sample (group-relative over its ``rollout.n`` trajectories) before the split.
"""

from __future__ import annotations

import torch

from asyncrl.consumers.grpo import (
    Batch,
    build_batch,
    group_advantages,
    policy_loss,
    token_logprobs,
)
from asyncrl.ops.config import RunConfig
from asyncrl.schemas.sample import Sample


def policy_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: RunConfig
) -> dict[str, float]:
    """One optimizer step on one mini-batch: clipped policy loss, backward, clip, step.

    ``old_log_prob`` is the rollout's (``use_rollout_log_probs``) or recomputed with the
    current weights before the update (verl's default for the actor).
    """
    actor = cfg.actor_rollout_ref.actor
    temperature = cfg.actor_rollout_ref.rollout.temperature
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask)
    if cfg.async_training.use_rollout_log_probs:
        old = batch.old_logprobs
    else:
        with torch.no_grad():
            old = token_logprobs(model, *args, temperature)
    logprobs = token_logprobs(model, *args, temperature)
    loss, metrics = policy_loss(
        logprobs, old, batch.advantages, batch.response_mask, actor.clip_ratio, actor.loss_agg_mode
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), actor.optim.grad_clip)
    optimizer.step()
    metrics["grad_norm"] = float(grad_norm)
    return metrics


def grpo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    cfg: RunConfig,
    device: torch.device,
    pad_token_id: int = 0,
) -> dict[str, float]:
    actor = cfg.actor_rollout_ref.actor
    rewards = torch.tensor([s.rewards for s in samples], dtype=torch.float32)
    advantages = group_advantages(rewards, cfg.algorithm.norm_adv_by_std_in_grpo)
    size = actor.ppo_mini_batch_size
    totals: dict[str, float] = {}
    n_mini = 0
    for start in range(0, len(samples), size):
        rows = [
            (s.prompt_ids, t.response_ids, t.response_logprobs, float(advantages[g, i]))
            for g, s in enumerate(samples[start : start + size], start=start)
            for i, t in enumerate(s.trajectories)
        ]
        masks = [t.response_mask for s in samples[start : start + size] for t in s.trajectories]
        batch = build_batch(rows, pad_token_id).to(device)
        for i, m in enumerate(masks):  # tool tokens (mask 0) are not trained on
            batch.response_mask[i, : len(m)] *= torch.tensor(m, dtype=torch.float32, device=device)
        m = policy_step(model, optimizer, batch, cfg)
        for k, v in m.items():
            totals[f"actor/{k}"] = totals.get(f"actor/{k}", 0.0) + v
        n_mini += 1
    metrics = {k: v / n_mini for k, v in totals.items()}
    lengths = [len(t.response_ids) for s in samples for t in s.trajectories]
    metrics["critic/score/mean"] = float(rewards.mean())
    metrics["critic/advantages/max"] = float(advantages.max())
    metrics["response_length/mean"] = sum(lengths) / len(lengths)
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        metrics.update(agent_metrics(samples))
    return metrics


def agent_metrics(samples: list[Sample]) -> dict[str, float]:
    """The agent loop's per-step figures: turns, tool calls, errors, latency, tool use."""
    trajs = [t for s in samples for t in s.trajectories]
    calls = sum(t.tool_calls for t in trajs)
    return {
        "agent/num_turns/mean": sum(t.num_turns for t in trajs) / len(trajs),
        "agent/num_turns/max": float(max(t.num_turns for t in trajs)),
        "agent/tool_calls/mean": calls / len(trajs),
        "agent/tool_errors/mean": sum(t.tool_errors for t in trajs) / len(trajs),
        "agent/tool_latency_s/mean": sum(t.tool_s for t in trajs) / calls if calls else 0.0,
        "agent/tool_use_rate": sum(t.tool_calls > 0 for t in trajs) / len(trajs),
    }


def simulated_update(samples: list[Sample], cfg: RunConfig) -> dict[str, float]:
    """The ``sim`` engine's counterpart on the trainer: no gradient, only the modelled time
    (``sim.train_s_per_sample`` per sample) and the batch statistics a real step reports."""
    import time

    time.sleep(cfg.sim.train_s_per_sample * len(samples))
    lengths = [len(t.response_ids) for s in samples for t in s.trajectories]
    rewards = [r for s in samples for r in s.rewards]
    return {
        "critic/score/mean": sum(rewards) / len(rewards),
        "response_length/mean": sum(lengths) / len(lengths),
    }
