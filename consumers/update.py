"""One local update ("step") of the policy on a batch of samples: GRPO, verl's layout.

A step holds ``require_batches`` mini-batches of ``ppo_mini_batch_size`` samples; each
mini-batch is one optimizer step, as in verl's actor update. Advantages are computed per
sample (group-relative over its ``rollout.n`` trajectories) before the split.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.decoupled import mask_stale, proximal_correction, stale_token_metrics
from asyncrl.consumers.grpo import (
    Batch,
    MicroBatch,
    aggregate,
    aggregate_norm,
    build_batch,
    group_advantages,
    kl_penalty,
    micro_batches,
    micro_logprobs,
    policy_loss,
    token_logprobs_and_entropy,
)
from asyncrl.consumers.precision import autocast
from asyncrl.consumers.probs_diff import probs_diff, probs_diff_metrics
from asyncrl.schemas.sample import Sample

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

log = logging.getLogger(__name__)


def policy_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: RunConfig,
    prox: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    ref_model: torch.nn.Module | None = None,
    group: ProcessGroup | None = None,
) -> dict[str, float]:
    """One optimizer step on one mini-batch: clipped policy loss, backward, clip, step.

    ``old_log_prob`` is the rollout's (``use_rollout_log_probs``) or recomputed with the
    current weights before the update (verl's default for the actor); with ``prox`` (decoupled
    PPO, ``compute_prox_log_prob``) it is the proximal log-probs, weighted by ``is_weights``.
    Metrics, verl's (``verl/workers/actor/dp_actor.py``, ``fsdp_workers.py``): ``pg_loss``,
    ``pg_clipfrac``, ``pg_clipfrac_lower`` (the dual clip's share), ``ppo_kl``, ``entropy``
    (the policy's token entropy on the valid response tokens, aggregated by
    ``loss_agg_mode``), ``grad_norm`` (before clipping) and ``lr`` (the learning rate this
    step used); with ``actor.use_kl_loss``, ``kl_loss`` (the KL estimate from ``ref_model``,
    aggregated as the loss) and ``kl_coef``, the loss then ``pg_loss + kl_coef * kl_loss``.

    With micro-batches (``actor.ppo_micro_batch_size_per_gpu`` or ``use_dynamic_bsz``), each
    one's forward and backward run in turn and their gradients add up before the one
    optimizer step: each micro-batch's loss is its share of the mini-batch's (divided by the
    mini-batch's token or sequence count, not its own), so the update is the whole
    mini-batch's, to float rounding, in the memory of one micro-batch.

    With ``group`` (sharded ranks, ``consumers/fsdp_update.py``) this is one rank's share of
    the mini-batch: its loss divides by the whole mini-batch's norms, the ranks' gradients sum
    (the backward runs on N x the loss, FSDP averaging over N ranks), and the loss metrics sum
    over the ranks, so the step is the whole one's.
    """
    actor = cfg.actor_rollout_ref.actor
    temperature = cfg.actor_rollout_ref.rollout.temperature
    micro = micro_batches(batch, *actor.micro_batching)
    old = prox if prox is not None else old_logprobs(model, batch, cfg, micro)
    ref = None
    if actor.use_kl_loss:
        if ref_model is None:
            raise ValueError("actor.use_kl_loss needs the reference model (ref_model)")
        with torch.no_grad(), autocast(cfg, ref_model):
            ref = micro_logprobs(ref_model, batch, micro, temperature)
    mask = batch.response_mask
    scale = actor.loss_scale_factor or cfg.data.max_response_length
    norms = (aggregate_norm(mask, actor.loss_agg_mode, scale), mask.sum().clamp(min=1))
    if group is not None:
        norms = _group_norms(norms, actor.loss_agg_mode, group)
    bonus = actor.entropy_coeff != 0  # the entropy then carries its gradient
    optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, float] = {}
    for index, b in micro:
        width = b.response_mask.shape[1]
        args = (b.input_ids, b.attention_mask, b.position_ids, b.response_mask)
        with autocast(cfg, model):
            logprobs, entropy = token_logprobs_and_entropy(model, *args, temperature, bonus)
            loss, part = policy_loss(
                logprobs,
                _rows(old, index, width),
                b.advantages,
                b.response_mask,
                actor.clip_range,
                actor.loss_agg_mode,
                is_weights=None if is_weights is None else _rows(is_weights, index, width),
                norms=norms,
                clip_ratio_c=actor.clip_ratio_c,
            )
            if ref is not None:
                kl = kl_penalty(logprobs, _rows(ref, index, width), actor.kl_loss_type)
                kl_loss = aggregate(kl, b.response_mask, actor.loss_agg_mode, norms[0])
                loss = loss + actor.kl_loss_coef * kl_loss
                part["kl_loss"] = float(kl_loss.detach())
            entropy_loss = aggregate(entropy, b.response_mask, actor.loss_agg_mode, norms[0])
            if bonus:  # verl: pg_loss - entropy_coeff * entropy
                loss = loss - actor.entropy_coeff * entropy_loss
        part["entropy"] = float(entropy_loss.detach())
        (loss if group is None else loss * group.size()).backward()  # FSDP averages: a sum
        for k, v in part.items():
            metrics[k] = metrics.get(k, 0.0) + v
    if group is not None:
        metrics = _group_sum(metrics, group)
    if ref is not None:
        metrics["kl_coef"] = actor.kl_loss_coef
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), actor.optim.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor: the norm over every rank's shard
        grad_norm = grad_norm.full_tensor()
    metrics["lr"] = float(optimizer.param_groups[0]["lr"])
    optimizer.step()
    metrics["grad_norm"] = float(grad_norm)
    return metrics


def _group_norms(
    norms: tuple[torch.Tensor, torch.Tensor], mode: str, group: ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole mini-batch's norms from each rank's: counts sum; a constant
    (``seq-mean-token-sum-norm``) stays."""
    import torch.distributed as dist

    both = torch.stack([n.to(torch.float64) for n in norms])
    dist.all_reduce(both, group=group)
    loss_norm = norms[0] if mode == "seq-mean-token-sum-norm" else both[0].to(norms[0].dtype)
    return loss_norm, both[1].to(norms[1].dtype)


def _group_sum(metrics: dict[str, float], group: ProcessGroup) -> dict[str, float]:
    """``metrics`` summed over the ranks (every rank has the same keys)."""
    import torch.distributed as dist

    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values, group=group)
    return dict(zip(keys, values.tolist(), strict=True))


def _group_any(x: bool, group: ProcessGroup | None) -> bool:
    """``x`` on any rank of ``group`` (None: this rank's)."""
    if group is None:
        return x
    import torch.distributed as dist

    flag = torch.tensor([float(x)])
    dist.all_reduce(flag, group=group)
    return bool(flag.item())


def old_logprobs(
    model: torch.nn.Module, batch: Batch, cfg: RunConfig, micro: list[MicroBatch] | None = None
) -> torch.Tensor:
    """The old policy's log-probs of a mini-batch: the rollout's (``use_rollout_log_probs``),
    or the model's now, before its update (in ``micro``, its micro-batches, if split already)."""
    if cfg.async_training.use_rollout_log_probs:
        return batch.old_logprobs
    if micro is None:
        micro = micro_batches(batch, *cfg.actor_rollout_ref.actor.micro_batching)
    with torch.no_grad(), autocast(cfg, model):
        return micro_logprobs(model, batch, micro, cfg.actor_rollout_ref.rollout.temperature)


def _rows(t: torch.Tensor, index: torch.Tensor | None, width: int) -> torch.Tensor:
    """A micro-batch's part of a mini-batch's ``[B, R]`` tensor (``index`` None: all of it)."""
    return t if index is None else t[index, :width]


def grpo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    cfg: RunConfig,
    device: torch.device,
    pad_token_id: int = 0,
    version: int | None = None,
    ref_model: torch.nn.Module | None = None,
    group: ProcessGroup | None = None,
) -> dict[str, float]:
    """One step on ``samples``: GRPO advantages per group, then one optimizer step per
    mini-batch. ``version`` is the trainer's weight version at this step (what
    ``async_training.max_token_version_lag`` measures token ages against; None: every token
    is current); ``ref_model``: the reference policy of ``actor.use_kl_loss``
    (:func:`reference_policy`). The off-policy options (``consumers/decoupled.py``) apply in this order:
    reward failures and tool tokens leave the mask, then tokens too stale; the proximal
    log-probs of every mini-batch are computed before the first update; the rollout
    correction is computed over the whole step (verl: once per batch). Where the step
    recomputes the old (or proximal) log-probs, the gap to the rollout's is reported under
    verl's ``training/rollout_probs_diff_*`` (``consumers/probs_diff.py``). ``group``: the
    ranks this rank's share of every mini-batch is trained with (:func:`policy_step`)."""
    actor = cfg.actor_rollout_ref.actor
    at = cfg.async_training
    rewards = torch.tensor([s.rewards for s in samples], dtype=torch.float32)
    valid = reward_valid(samples)
    advantages = group_advantages(rewards, cfg.algorithm.norm_adv_by_std_in_grpo, valid=valid)
    size = actor.ppo_mini_batch_size
    stale = at.max_token_version_lag is not None and version is not None
    batches: list[Batch] = []
    extra: dict[str, float] = {}
    stale_counts = [0.0, 0.0, 0.0]  # tokens trainable, of them masked as stale, trajectories hit
    for start in range(0, len(samples), size):
        rows = [
            (s.prompt_ids, t.response_ids, t.response_logprobs, float(advantages[g, i]))
            for g, s in enumerate(samples[start : start + size], start=start)
            for i, t in enumerate(s.trajectories)
        ]
        masks = [
            np.zeros_like(t.response_mask) if t.reward_failed else t.response_mask
            for s in samples[start : start + size]
            for t in s.trajectories
        ]
        batch = build_batch(rows, pad_token_id).to(device)
        for i, m in enumerate(masks):  # tool tokens (mask 0) are not trained on, nor failures
            batch.response_mask[i, : len(m)] *= torch.tensor(m, dtype=torch.float32, device=device)
        if stale:
            mask_stale(batch, samples[start : start + size], version or 0, cfg, stale_counts)
        batches.append(batch)
    if stale:
        extra.update(stale_token_metrics(*stale_counts))
    correction = proximal_correction(model, batches, cfg) if at.compute_prox_log_prob else None
    masked_more = stale or (correction is not None and correction.rejects)
    totals: dict[str, float] = {}
    n_mini = 0
    # With ppo_epochs > 1: each mini-batch's old log-probs as its first pass had them, so the
    # later passes clip against the same policy (verl computes them once per step).
    olds: dict[int, torch.Tensor] = {}
    # The trainer's recomputed log-probs against the rollout's, token by token, where the
    # step recomputes them: verl's training/rollout_probs_diff_*.
    recomputes = correction is not None or not at.use_rollout_log_probs
    gaps: list[torch.Tensor] = []
    for epoch in range(actor.ppo_epochs):
        for i, batch in enumerate(batches):
            prox = weights = None
            if correction is not None:
                prox, weights = correction.prox[i], correction.weights[i]
                if epoch == 0:
                    gaps.append(probs_diff(prox, batch.old_logprobs, batch.response_mask))
                batch.response_mask = correction.masks[i]
            maybe_empty = valid is not None or masked_more
            if maybe_empty and not _group_any(bool(batch.response_mask.any()), group):
                continue  # nothing left to learn from in this mini-batch (failed, stale, rejected)
            if prox is None and (actor.ppo_epochs > 1 or recomputes):
                if epoch == 0:
                    olds[i] = old_logprobs(model, batch, cfg)
                    if recomputes:
                        gaps.append(probs_diff(olds[i], batch.old_logprobs, batch.response_mask))
                prox = olds[i]
            stats = policy_step(
                *(model, optimizer, batch, cfg, prox),
                *(weights, ref_model, group),
            )
            for k, v in stats.items():
                totals[f"actor/{k}"] = totals.get(f"actor/{k}", 0.0) + v
            n_mini += 1
    metrics = {k: v / n_mini for k, v in totals.items()}
    if recomputes:
        metrics.update(probs_diff_metrics(gaps, group))
    if correction is not None:
        metrics.update(correction.metrics)
    metrics.update(extra)
    metrics.update(data_metrics(samples, advantages, cfg))
    metrics.update(reward_metrics(samples))
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        metrics.update(agent_metrics(samples))
    return metrics


def reference_policy(
    cfg: RunConfig, device: torch.device, start: torch.nn.Module | None = None
) -> torch.nn.Module | None:
    """The frozen policy the run started from, for ``actor.use_kl_loss`` (None without it):
    a copy of ``start``, the starting policy just loaded (not loaded a second time), else
    loaded as the trainer's own first weights are, so a resumed trainer gets the same one."""
    if not cfg.actor_rollout_ref.actor.use_kl_loss:
        return None
    if start is not None:
        import copy

        ref = copy.deepcopy(start)
    else:
        from asyncrl.models.warm_start import load_policy

        ref, _ = load_policy(cfg)
    ref.to(device).eval().requires_grad_(False)
    return ref


def data_metrics(
    samples: list[Sample], advantages: torch.Tensor, cfg: RunConfig
) -> dict[str, float]:
    """verl's ``compute_data_metrics`` (``verl/trainer/ppo/metric_utils.py``) on a step's
    batch, one row per trajectory, no critic.

    * ``critic/score/*`` and ``critic/rewards/*`` (the same here: no KL penalty in the
      reward): mean, max, min of the trajectories' rewards, aborted ones (no response token)
      left out;
    * ``critic/advantages/*`` and ``critic/returns/*`` (GRPO's returns are its advantages):
      over the valid response tokens (tool tokens excluded), so a trajectory weighs by its
      trained tokens;
    * ``response_length/*``: response tokens per trajectory (tool responses included, as
      verl's attention mask counts them); ``clip_ratio`` is the share that reached
      ``data.max_response_length``. ``response_length_non_aborted/*`` the same over the
      non-aborted ones, ``response/aborted_ratio`` the share aborted;
    * ``prompt_length/*``: prompt tokens; ``clip_ratio`` the share at ``data.max_prompt_length``;
    * ``num_turns/*``: messages of the conversation, the prompt counted (verl's agent loop:
      2 for a single turn). asyncrl's trajectories count one message per tool response where
      verl counts one per round of them, so the two agree while a turn makes one call at most.
    """
    rows = [
        (s, t, float(advantages[g, i]))
        for g, s in enumerate(samples)
        for i, t in enumerate(s.trajectories)
    ]
    lengths = [float(len(t.response_ids)) for _, t, _ in rows]
    prompts = [float(len(s.prompt_ids)) for s, _, _ in rows]
    kept = [r for r, n in zip(rows, lengths, strict=True) if n > 0 and not r[1].reward_failed]
    kept = kept or rows
    scores = [t.reward for _, t, _ in kept]
    tokens = [(a, float(np.sum(t.response_mask))) for _, t, a in rows]
    valid = [a for a, n in tokens if n > 0] or [0.0]
    n_valid = sum(n for _, n in tokens)
    adv_mean = sum(a * n for a, n in tokens) / n_valid if n_valid else 0.0
    non_aborted = [n for n in lengths if n > 0] or [0.0]
    max_resp, max_prompt = cfg.data.max_response_length, cfg.data.max_prompt_length
    out = {
        **_stats("critic/score", scores),
        **_stats("critic/rewards", scores),
        "critic/advantages/mean": adv_mean,
        "critic/advantages/max": max(valid),
        "critic/advantages/min": min(valid),
        "critic/returns/mean": adv_mean,
        "critic/returns/max": max(valid),
        "critic/returns/min": min(valid),
        **_stats("response_length", lengths),
        "response_length/clip_ratio": _share(lengths, lambda n: n >= max_resp),
        **_stats("response_length_non_aborted", non_aborted),
        "response_length_non_aborted/clip_ratio": _share(non_aborted, lambda n: n >= max_resp),
        "response/aborted_ratio": _share(lengths, lambda n: n == 0),
        **_stats("prompt_length", prompts),
        "prompt_length/clip_ratio": _share(prompts, lambda n: n >= max_prompt),
    }
    # the prompt, then at least the one assistant turn (samples from before schema 3 say 0)
    turns = [float(1 + max(t.num_turns, 1)) for _, t, _ in rows]
    out.update({"num_turns/min": min(turns), "num_turns/max": max(turns)})
    out["num_turns/mean"] = sum(turns) / len(turns)
    return out


def reward_valid(samples: list[Sample]) -> torch.Tensor | None:
    """``[G, n]``: False where a trajectory's reward failed (``reward_error``); None if none did
    (the update is then exactly what it was before reward failures existed)."""
    failed = [[t.reward_failed for t in s.trajectories] for s in samples]
    if not any(any(row) for row in failed):
        return None
    return ~torch.tensor(failed, dtype=torch.bool)


def reward_metrics(samples: list[Sample]) -> dict[str, float]:
    """``reward/failures``: trajectories of the step whose reward function raised or timed out
    (not trained on); ``reward/<key>/mean``: each extra number a reward function's dict
    returned, over the trajectories that have it."""
    import json

    trajs = [t for s in samples for t in s.trajectories]
    out = {"reward/failures": float(sum(t.reward_failed for t in trajs))}
    extra: dict[str, list[float]] = {}
    for t in trajs:
        for key, value in (json.loads(t.reward_extra) if t.reward_extra else {}).items():
            extra.setdefault(key, []).append(float(value))
    for key, values in sorted(extra.items()):
        out[f"reward/{key}/mean"] = sum(values) / len(values)
    return out


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    return {
        f"{prefix}/mean": sum(values) / len(values),
        f"{prefix}/max": float(max(values)),
        f"{prefix}/min": float(min(values)),
    }


def _share(values: list[float], pred) -> float:
    return sum(1 for v in values if pred(v)) / len(values)


def agent_metrics(samples: list[Sample]) -> dict[str, float]:
    """The agent loop's per-step figures verl has no name for (its ``num_turns/*`` are in
    :func:`data_metrics`): tool calls and errors per trajectory, latency per call, tool use."""
    trajs = [t for s in samples for t in s.trajectories]
    calls = sum(t.tool_calls for t in trajs)
    return {
        "agent/tool_calls/mean": calls / len(trajs),
        "agent/tool_errors/mean": sum(t.tool_errors for t in trajs) / len(trajs),
        "agent/tool_latency_s/mean": sum(t.tool_s for t in trajs) / calls if calls else 0.0,
        "agent/tool_use_rate": sum(t.tool_calls > 0 for t in trajs) / len(trajs),
    }


def warn_if_no_reward(samples: list[Sample], metrics: dict[str, float], step: int) -> None:
    """Say so when the reward failed for every trajectory of ``step``: it learned nothing,
    and the progress bar's failure count alone does not tell why."""
    trajectories = sum(len(s.trajectories) for s in samples)
    failed = int(metrics.get("reward/failures", 0))
    if trajectories and failed >= trajectories:
        first = next(
            (t.reward_error for s in samples for t in s.trajectories if t.reward_error), ""
        )
        log.warning(
            "step %d: the reward failed for all %d trajectories, so the step learned "
            "nothing (custom_reward_function; the rollout workers' logs have each failure): %s",
            *(step, trajectories, first),
        )
