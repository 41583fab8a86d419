"""A step's off-policy glue: the proximal log-probs of every mini-batch, the rollout correction
over the whole step, and the stale-token mask (the maths is in ``consumers/correction.py``).

Order within a step (``update.grpo_update``):
1. each mini-batch's mask loses tool tokens, reward failures, then tokens older than
   ``async_training.max_token_version_lag`` (``mask_stale``);
2. with ``compute_prox_log_prob``, the proximal log-probs of every mini-batch, under the
   weights the step starts from, before its first optimizer step;
3. the rollout correction over the step's tokens at once (its batch normalisation and metrics
   are per step, as verl computes them once per batch), split back per mini-batch;
4. one optimizer step per mini-batch against the proximal log-probs, weighted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.correction import rollout_correction, stale_token_mask
from asyncrl.consumers.grpo import Batch, micro_batches, micro_logprobs
from asyncrl.consumers.precision import autocast
from asyncrl.schemas.sample import Sample


@dataclass
class StepCorrection:
    """Per mini-batch (in order): proximal log-probs, importance weights (None: no
    rollout_is) and the mask after rejection; the step's ``rollout_corr/*`` metrics."""

    prox: list[torch.Tensor]
    weights: list[torch.Tensor | None]
    masks: list[torch.Tensor]
    metrics: dict[str, float]
    rejects: bool
    """rollout_rs is on: a mini-batch may be left with no token to train."""


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """Row-concatenate ``[b_i, R_i]`` tensors, right-padding each with 0 to the widest."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def _split(whole: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, row = [], 0
    for p in like:
        out.append(whole[row : row + p.shape[0], : p.shape[1]].contiguous())
        row += p.shape[0]
    return out


def proximal_correction(
    model: torch.nn.Module, batches: list[Batch], cfg: RunConfig
) -> StepCorrection:
    """Steps 2-3 of the module docstring. The proximal log-probs are taken without gradient,
    in the model's current mode, at ``rollout.temperature`` (as the rollout's were)."""
    temperature = cfg.actor_rollout_ref.rollout.temperature
    t0 = time.perf_counter()
    micro = cfg.actor_rollout_ref.actor.micro_batching
    with torch.no_grad(), autocast(cfg, model):
        prox = [micro_logprobs(model, b, micro_batches(b, *micro), temperature) for b in batches]
    elapsed = time.perf_counter() - t0
    masks = [b.response_mask for b in batches]
    rc = cfg.algorithm.rollout_correction
    corrected = rollout_correction(
        _stack(prox), _stack([b.old_logprobs for b in batches]), _stack(masks), rc
    )
    weights: list[torch.Tensor | None] = [None] * len(batches)
    if corrected.weights is not None:
        weights = [*_split(corrected.weights, masks)]
    metrics = {**corrected.metrics, "timing_s/old_log_prob": elapsed}
    return StepCorrection(
        prox, weights, _split(corrected.response_mask, masks), metrics, rc.rollout_rs is not None
    )


def mask_stale(
    batch: Batch, samples: list[Sample], version: int, cfg: RunConfig, counts: list[float]
) -> None:
    """Step 1's last part, in place on ``batch.response_mask`` (rows in the order of the
    samples' trajectories). ``counts`` accumulates (tokens trainable before, of them masked as
    stale, trajectories that lost a token)."""
    at = cfg.async_training
    assert at.max_token_version_lag is not None
    versions = [t.token_versions() for s in samples for t in s.trajectories]
    width = batch.response_mask.shape[1]
    keep = stale_token_mask(
        versions, width, version, at.max_token_version_lag, at.stale_token_action
    ).to(batch.response_mask.device)
    before = batch.response_mask
    after = before * keep
    counts[0] += float(before.sum())
    counts[1] += float((before - after).sum())
    counts[2] += float(((before - after).sum(-1) > 0).sum())
    batch.response_mask = after


def stale_token_metrics(trainable: float, masked: float, trajectories: float) -> dict[str, float]:
    """``fully_async/stale_tokens/masked_ratio``: share of the step's trainable response tokens
    that max_token_version_lag left out; ``masked_trajectories``: trajectories that lost one."""
    return {
        "fully_async/stale_tokens/masked_ratio": masked / trainable if trainable else 0.0,
        "fully_async/stale_tokens/masked_trajectories": trajectories,
    }
