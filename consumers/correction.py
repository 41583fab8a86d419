"""Off-policy corrections of a step's batch: verl's rollout correction (importance sampling and
rejection), its mismatch metrics, and the stale-token mask.

Three policies (decoupled PPO, AReaL; verl's ``async_training.compute_prox_log_prob`` with
``algorithm.rollout_correction``): the *behaviour* policy generated each token (the rollout's
log-prob ``b_t``, recorded under the weights of the token's segment, so a partial rollout's
tokens each carry their own version's), the *proximal* policy is the trainer's weights before
the step (``p_t``), and the current policy ``pi_theta`` is being updated. With
``lr_t = p_t - b_t`` (log pi_prox / pi_behaviour), per token, to minimise::

    l_t = w_t * max(-A r_t, -A clip(r_t, 1 - eps, 1 + eps)),   r_t = exp(logp_t - p_t)

``w_t`` (detached) is ``min(exp(lr_t), C)`` for ``rollout_is=token`` and
``min(exp(sum_t lr_t), C)`` over the trajectory's trained tokens for ``sequence`` (C:
``rollout_is_threshold``). Rejection (``rollout_rs``) zeroes the mask of the tokens, or the
trajectories, whose divergence estimate passes its threshold. Formulas and metric names are
verl's (``verl/trainer/ppo/rollout_corr_helper.py`` and ``core_algos.compute_policy_loss_vanilla``
at b178a3cd56f58b2d502255daba591e92833930a7), as is the ``exp(+-20)`` safety bound. One
deliberate difference: sequence-level shares and means are over the trajectories with at least
one trained token (verl's count every row; here a reward failure's row is all mask 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from asyncrl.config.offpolicy import RolloutCorrectionConfig

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to +-20 before exponentiating (verl's bound)."""
PREFIX = "rollout_corr/"


def _mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _row_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1)


def _row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _valid_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(x.masked_fill(mask <= 0, -math.inf).max())


def _valid_min(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(x.masked_fill(mask <= 0, math.inf).min())


@dataclass
class Corrected:
    """What the correction hands the policy loss, all ``[B, R]``."""

    weights: torch.Tensor | None
    """Truncated (and optionally normalised) importance weights, detached; None: no rollout_is."""
    response_mask: torch.Tensor
    """The mask after rejection (equal to the input without rollout_rs)."""
    metrics: dict[str, float]
    """``rollout_corr/*``."""


def importance_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: float,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights (verl's ``compute_rollout_correction_weights``).

    ``log_ratio`` is ``log pi_prox - log pi_behaviour`` per token. token: ``w_t = exp(lr_t)``;
    sequence: ``w_t = exp(sum_s lr_s)`` for every token of the row. Metrics are taken before
    truncation: ``rollout_is_mean`` (masked mean), ``_max``/``_min``, ``_ratio_fraction_high``
    (share above C) and ``_low`` (below 1/C), per token or per sequence as the level;
    ``_std`` and ``_eff_sample_size`` (``1 / mean((w' / mean w')^2)``) of the weights clamped
    to ``[1/C, C]``. Then ``w = min(w, C)``; ``batch_normalize`` divides by the mean of the
    truncated weights (``rollout_is_batch_norm_factor``)."""
    mask = mask.to(log_ratio.dtype)
    m: dict[str, float] = {}
    log_hi, log_lo = math.log(threshold), math.log(1.0 / threshold)
    rows = mask.sum(-1) > 0
    if level == "token":
        w = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
        m["rollout_is_max"], m["rollout_is_min"] = _valid_max(w, mask), _valid_min(w, mask)
        m["rollout_is_ratio_fraction_high"] = float(_mean((w > threshold).to(mask.dtype), mask))
        m["rollout_is_ratio_fraction_low"] = float(_mean((w < 1 / threshold).to(mask.dtype), mask))
    elif level == "sequence":
        seq_log = _row_sum(log_ratio, mask)
        w = torch.exp(seq_log.clamp(-SAFETY_BOUND, SAFETY_BOUND))[:, None] * mask
        valid = seq_log[rows]
        m["rollout_is_max"] = math.exp(min(float(valid.max()), SAFETY_BOUND))
        m["rollout_is_min"] = float(torch.exp(valid.min()))
        m["rollout_is_ratio_fraction_high"] = float((valid > log_hi).float().mean())
        m["rollout_is_ratio_fraction_low"] = float((valid < log_lo).float().mean())
    else:
        raise ValueError(f"rollout_is must be token or sequence, not {level!r}")
    m["rollout_is_mean"] = float(_mean(w, mask))
    clamped = w.clamp(1.0 / threshold, threshold)
    if mask.sum() > 1:
        var = _mean(clamped**2, mask) - _mean(clamped, mask) ** 2
        m["rollout_is_std"] = float(var.clamp(min=0).sqrt())
    else:
        m["rollout_is_std"] = 0.0
    normed = clamped / (_mean(clamped, mask) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / float(_mean(normed**2, mask))
    w = w.clamp(max=threshold).detach()
    if batch_normalize:
        mean = _mean(w, mask) if level == "token" else _row_mean(w, mask)[rows].mean()
        if float(mean) > 1e-8:
            w = w / mean
            m["rollout_is_batch_norm_factor"] = float(mean)
        else:
            m["rollout_is_batch_norm_factor"] = 1.0
    return w, m


def rejection_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, cfg: RolloutCorrectionConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The mask with rejected tokens at 0 (verl's ``compute_rollout_rejection_mask``).

    Per token, with ``lr`` clamped to +-20: ``k1 = -lr``, ``k2 = lr^2 / 2``,
    ``k3 = exp(lr) - 1 - lr``. ``token_kX`` tests each token; ``seq_sum_kX``/``seq_mean_kX``/
    ``seq_max_kX`` the row's sum/mean/max over its trained tokens, and keep or reject the whole
    row. k1 keeps ``log(lower) <= stat <= log(upper)``; k2/k3 keep ``stat <= upper``. Every
    option must pass. Metrics per option ``rollout_rs_<opt>_{mean,max,min,fraction_high,
    fraction_low,masked_fraction,seq_masked_fraction}`` and overall ``rollout_rs_masked_fraction``
    (share of trained tokens rejected), ``rollout_rs_seq_masked_fraction`` (share of
    trajectories with a rejected token)."""
    mask = mask.to(log_ratio.dtype)
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    k = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    rows = mask.sum(-1) > 0
    keep_all = torch.ones_like(mask)
    m: dict[str, float] = {}
    for option, (lower, upper) in cfg.rs_thresholds().items():
        level, est = option.rsplit("_", 1)
        per_token = k[est]
        if level == "token":
            stat = per_token
        elif level == "seq_sum":
            stat = _row_sum(per_token, mask)[:, None].expand_as(mask)
        elif level == "seq_mean":
            stat = _row_mean(per_token, mask)[:, None].expand_as(mask)
        else:  # seq_max
            top = per_token.masked_fill(mask <= 0, -math.inf).max(-1).values
            stat = torch.where(rows, top, torch.zeros_like(top))[:, None].expand_as(mask)
        keep = stat <= upper
        if lower is not None:
            keep = keep & (stat >= lower)
        keep_f = keep.to(mask.dtype)
        keep_all = keep_all * keep_f
        p = f"rollout_rs_{option}"
        m[f"{p}_mean"] = float(_mean(stat, mask))
        if level == "token":
            m[f"{p}_max"], m[f"{p}_min"] = _valid_max(stat, mask), _valid_min(stat, mask)
            high = _mean((stat > upper).to(mask.dtype), mask)
            low = _mean((stat < lower).to(mask.dtype), mask) if lower is not None else 0.0
        else:
            seq = stat[:, 0][rows]
            m[f"{p}_max"], m[f"{p}_min"] = float(seq.max()), float(seq.min())
            high = (seq > upper).float().mean()
            low = (seq < lower).float().mean() if lower is not None else 0.0
        m[f"{p}_fraction_high"], m[f"{p}_fraction_low"] = float(high), float(low)
        m[f"{p}_masked_fraction"] = float(_mean(1.0 - keep_f, mask))
        m[f"{p}_seq_masked_fraction"] = _seq_rejected(keep_f, mask)
    m["rollout_rs_masked_fraction"] = float(_mean(1.0 - keep_all, mask))
    m["rollout_rs_seq_masked_fraction"] = _seq_rejected(keep_all, mask)
    return mask * keep_all, m


def _seq_rejected(keep: torch.Tensor, mask: torch.Tensor) -> float:
    rows = mask.sum(-1) > 0
    hit = ((1.0 - keep) * mask).sum(-1) > 0
    return float(hit[rows].float().mean())


def offpolicy_metrics(
    prox: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """verl's ``compute_offpolicy_metrics``: how far the trainer's log-probs ``prox`` are from
    the rollout's ``behaviour``, over the trained tokens.

    ``kl = mean(b - p)`` (k1 estimate of KL(behaviour || prox)); ``k3_kl = mean(exp(lr) - lr
    - 1)``; ``training_ppl``/``rollout_ppl``: mean over trajectories of ``exp(-mean_t logp)``
    (``*_log_ppl`` without the exp); ``log_ppl_diff``: mean over trajectories of
    ``mean_t b - mean_t p`` (``_abs_diff``, ``_max``, ``_min``), ``ppl_ratio`` the mean of its
    exp; ``chi2_token = mean(rho_t^2) - 1`` and ``chi2_seq = mean_i(prod_t rho_t)^2 - 1`` with
    ``rho = exp(lr)``."""
    mask = mask.to(prox.dtype)
    rows = mask.sum(-1) > 0
    lr = prox - behaviour
    safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    p_row, b_row = _row_mean(prox, mask)[rows], _row_mean(behaviour, mask)[rows]
    diff = b_row - p_row
    seq = _row_sum(lr, mask)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-p_row).mean()),
        "training_log_ppl": float((-p_row).mean()),
        "kl": float(_mean(behaviour - prox, mask)),
        "k3_kl": float(_mean(torch.exp(lr) - lr - 1, mask)),
        "rollout_ppl": float(torch.exp(-b_row).mean()),
        "rollout_log_ppl": float((-b_row).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": float(_mean(torch.exp(safe) ** 2, mask)) - 1.0,
        "chi2_seq": float(torch.exp(2.0 * seq).mean()) - 1.0,
    }


def rollout_correction(
    prox: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    cfg: RolloutCorrectionConfig,
) -> Corrected:
    """Weights, rejection and the mismatch metrics of one step's batch (verl's
    ``compute_rollout_correction_and_rejection_mask``), all names prefixed ``rollout_corr/``.
    The weights and the rejection both read the input mask; a token rejected keeps its
    weight but leaves the loss through the mask. No trained token: nothing to correct."""
    mask = mask.to(prox.dtype)
    if not bool(mask.any()):
        return Corrected(None if cfg.rollout_is is None else torch.zeros_like(mask), mask, {})
    log_ratio = prox - behaviour
    metrics: dict[str, float] = {}
    weights = None
    if cfg.rollout_is is not None:
        weights, is_metrics = importance_weights(
            log_ratio,
            mask,
            cfg.rollout_is,
            cfg.rollout_is_threshold,
            cfg.rollout_is_batch_normalize,
        )
        metrics.update(is_metrics)
    new_mask = mask
    if cfg.rollout_rs is not None:
        new_mask, rs_metrics = rejection_mask(log_ratio, mask, cfg)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(prox, behaviour, mask))
    return Corrected(weights, new_mask, {PREFIX + k: v for k, v in metrics.items()})


def stale_token_mask(
    token_versions: Sequence[Sequence[int] | npt.NDArray[np.int64]],
    width: int,
    version: int,
    max_lag: int,
    action: str,
) -> torch.Tensor:
    """``[B, width]`` 1 where a response token may be trained: generated at most ``max_lag``
    versions before ``version`` (``version - v_t <= max_lag``). ``drop``: a trajectory with
    any older token is 0 everywhere. Rows are each trajectory's per-token versions
    (``Trajectory.token_versions``)."""
    out = torch.ones((len(token_versions), width), dtype=torch.float32)
    for i, row in enumerate(token_versions):
        versions = np.asarray(row, dtype=np.int64)
        if not len(versions):
            continue
        fresh = torch.from_numpy((version - versions <= max_lag).astype(np.float32))
        if action == "drop" and not bool(fresh.all()):
            fresh = torch.zeros_like(fresh)
        out[i, : len(versions)] = fresh
    return out
