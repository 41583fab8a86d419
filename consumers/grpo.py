"""GRPO maths: group-relative advantages, token logprobs, the clipped policy loss, batching.

Batch layout (verl's): row ``i`` is ``[pad.. prompt_i | response_i ..pad]``, i.e. prompts
left-padded to width ``P`` and responses right-padded to width ``R``, so the responses of all
rows start at column ``P`` and every per-token tensor (logprobs, masks) is ``[B, R]``.
Positions count real tokens only, so each row's logits equal those of the row alone (and those
the rollout engine saw, which left-pads the whole sequence instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

LossAggMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]


def group_advantages(
    rewards: torch.Tensor,
    norm_by_std: bool,
    eps: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Outcome advantages relative to the group: ``A_ij = (r_ij - mean_j r_ij) / (std_j + eps)``.

    ``rewards`` is ``[G, n]``: G prompts, n trajectories each. The group mean is the baseline
    (no critic). With ``norm_by_std`` (GRPO) the difference is divided by the group's unbiased
    std (``torch.std``, as verl); without it (Dr. GRPO) it is not. A group whose rewards are all
    equal gets advantage 0 for every member: it carries no signal about which sample was better.
    As in verl, a group of one (n = 1) uses mean 0 and std 1, i.e. the raw reward.

    Example, one group of rewards [1, 0, 0, 0]: mean 0.25, std = sqrt((0.75^2 + 3 * 0.25^2) / 3)
    = 0.5, so A = [1.5, -0.5, -0.5, -0.5].

    ``valid`` (``[G, n]`` bool) leaves trajectories out, those whose reward failed: they get
    advantage 0, and each group's mean and std are over its valid members only (a group with
    one valid member of several: 0 too, nothing to compare it with). [1, x, 0, 0] with x left
    out: mean 1/3, std = sqrt((4/9 + 2/9) / 2) = 0.577, A = [1.155, 0, -0.577, -0.577].
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [G, n], got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    if valid is not None:
        return _masked_group_advantages(rewards, valid.bool(), norm_by_std, eps)
    if rewards.shape[1] == 1:
        mean, std = torch.zeros_like(rewards), torch.ones_like(rewards)
    else:
        mean = rewards.mean(dim=1, keepdim=True)
        std = rewards.std(dim=1, keepdim=True)
    adv = rewards - mean
    return adv / (std + eps) if norm_by_std else adv


def _masked_group_advantages(
    rewards: torch.Tensor, valid: torch.Tensor, norm_by_std: bool, eps: float
) -> torch.Tensor:
    v = valid.to(rewards.dtype)
    if rewards.shape[1] == 1:
        return rewards * v
    count = v.sum(dim=1, keepdim=True)
    mean = (rewards * v).sum(dim=1, keepdim=True) / count.clamp(min=1)
    var = (((rewards - mean) * v) ** 2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
    adv = (rewards - mean) * v * (count > 1)
    return adv / (var.sqrt() + eps) if norm_by_std else adv


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    response_mask: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``[B, R]`` logprobs of each response token under ``model`` at ``temperature``.

    With ``P = L - R`` the prompt width, token ``input_ids[:, P + t]`` is predicted by the logits
    at column ``P + t - 1``: ``lp[:, t] = log_softmax(logits[:, P - 1 + t] / T)[input_ids[:, P + t]]``,
    exactly what the engine records when it samples that token. Entries where
    ``response_mask`` is 0 are set to 0. Gradients flow (the trainer differentiates this).
    ``position_ids`` default to ``cumsum(attention_mask) - 1``.
    """
    lp, _ = _token_logprobs(
        model, input_ids, attention_mask, position_ids, response_mask, temperature, False
    )
    return lp


def token_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    response_mask: torch.Tensor,
    temperature: float,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` and, from the same forward pass, the ``[B, R]`` entropy of the
    policy's next-token distribution at each response position (at ``temperature``, as verl's
    ``entropy_from_logits``: ``H = -sum_v p_v log p_v``), 0 where the mask is 0; detached
    unless ``entropy_grad`` (an entropy bonus in the loss)."""
    lp, entropy = _token_logprobs(
        model, input_ids, attention_mask, position_ids, response_mask, temperature, True,
        entropy_grad,
    )  # fmt: skip
    assert entropy is not None
    return lp, entropy


def _token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    response_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    width = response_mask.shape[1]
    prompt_width = input_ids.shape[1] - width
    if position_ids is None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    logits = logits[:, prompt_width - 1 : prompt_width - 1 + width].float() / temperature
    targets = input_ids[:, prompt_width:]
    log_probs = torch.log_softmax(logits, dim=-1)
    mask = response_mask.to(log_probs.dtype)
    lp = log_probs.gather(-1, targets[..., None]).squeeze(-1) * mask
    if not with_entropy:
        return lp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1) * mask
    return lp, entropy


def aggregate(
    x: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: LossAggMode,
    norm: torch.Tensor | None = None,
) -> torch.Tensor:
    """A ``[B, R]`` per-token quantity reduced over the valid tokens (mask m), as verl's
    ``agg_loss``, over the rows with a valid token:

    * ``token-mean``: ``sum(x * m) / sum(m)`` (every token weighs the same);
    * ``seq-mean-token-mean``: ``mean_i(sum_t x_it m_it / sum_t m_it)`` (every row does);
    * ``seq-mean-token-sum``: ``mean_i(sum_t x_it m_it)`` (a longer row weighs more);
    * ``seq-mean-token-sum-norm``: ``sum(x * m) / scale``, a constant (Dr. GRPO: no length
      bias; :func:`aggregate_norm`).

    ``norm``: the denominator of a larger batch these rows are a micro-batch of
    (:func:`aggregate_norm` of its mask), so that the micro-batches' results add up to the
    whole batch's (gradient accumulation); None: these rows' own."""
    mask = mask.to(x.dtype)
    if norm is None:
        norm = aggregate_norm(mask, loss_agg_mode)
    if loss_agg_mode in ("token-mean", "seq-mean-token-sum-norm"):
        return (x * mask).sum() / norm
    per_seq = (x * mask).sum(-1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    return per_seq[mask.sum(-1) > 0].sum() / norm


def aggregate_norm(
    mask: torch.Tensor, loss_agg_mode: LossAggMode, scale: float | None = None
) -> torch.Tensor:
    """The denominator :func:`aggregate` divides by: valid tokens (``token-mean``), rows with
    a valid token (``seq-mean-*``, at least 1), or ``scale`` (``seq-mean-token-sum-norm``;
    None: the padded width ``R``, verl's fallback)."""
    if loss_agg_mode == "token-mean":
        return mask.sum().clamp(min=1)
    if loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return (mask.sum(-1) > 0).sum().clamp(min=1).to(mask.dtype)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return torch.tensor(float(scale or mask.shape[-1]), dtype=mask.dtype, device=mask.device)
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference (verl's ``kl_penalty``):
    ``low_var_kl``/``k3``: ``exp(r) - r - 1`` with ``r = ref - logp`` (r clamped to +-20, the
    result to +-10, as verl); ``kl``/``k1``: ``logp - ref``; ``mse``/``k2``:
    ``(logp - ref)^2 / 2``; ``abs``: ``|logp - ref|``. All 0 where the two agree."""
    diff = logprobs - ref_logprobs
    if kind in ("kl", "k1"):
        return diff
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    if kind in ("low_var_kl", "k3"):
        r = (-diff).clamp(min=-20, max=20)
        return (torch.exp(r) - r - 1).clamp(min=-10, max=10)
    raise ValueError(f"unknown kl_loss_type {kind!r}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float | tuple[float, float],
    loss_agg_mode: LossAggMode = "token-mean",
    is_weights: torch.Tensor | None = None,
    norms: tuple[torch.Tensor, torch.Tensor] | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, to minimise. All per-token tensors are ``[B, R]``.

    Per token: ``rho = exp(logp - old_logp)`` and
    ``l = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))`` (the pessimistic of the
    unclipped and clipped objectives, negated). ``clip_ratio`` is ``eps`` for both sides, or
    ``(eps_low, eps_high)`` (DAPO's clip-higher: a larger ``eps_high`` lets unlikely tokens of
    good answers gain more). ``advantages`` is ``[B]`` (broadcast over the sequence: one
    outcome reward per trajectory) or ``[B, R]``.

    Dual clip (``clip_ratio_c = c > 1``, verl's default 3): where ``A < 0`` the loss is at
    most ``-A * c``, so a token whose ratio ran far above 1 under a negative advantage (a
    stale sample the policy has since come to like) stops pushing; ``l = min(l, -A * c)``
    there. None: no dual clip.

    Aggregation over the valid tokens (mask m):
      * ``token-mean``: ``sum(l * m) / sum(m)`` (every token weighs the same; DAPO / verl default);
      * ``seq-mean-token-mean``: ``mean_i(sum_t l_it m_it / sum_t m_it)`` (every sequence does).

    Metrics: ``pg_loss``; ``pg_clipfrac``, the share of tokens where the clipped term won (its
    gradient is zero there); ``pg_clipfrac_lower``, the share the dual clip bounded (0 without
    it); ``ppo_kl``, the masked mean of ``old_logp - logp``, a k1 estimate
    of KL(old || new) that is 0 on-policy.

    Gradient check, on-policy (rho = 1, no clipping): d l / d logp = -A * rho = -A, so the loss
    is the REINFORCE estimator with the group baseline.

    Decoupled PPO (``consumers/correction.py``): ``old_logprobs`` are the proximal policy's and
    ``is_weights`` (``[B, R]``, detached) the importance weights behaviour -> proximal:
    ``l_t = w_t * max(-A rho_t, -A clip(rho_t))``, as verl's ``compute_policy_loss_vanilla``
    applies ``rollout_is_weights``. None: no weighting (the loss above, unchanged).

    ``norms``: (``aggregate_norm`` of the loss, valid tokens) of the mini-batch these rows are
    a micro-batch of: the loss and the metrics are then this micro-batch's shares, which add
    up over the micro-batches to the mini-batch's (``consumers/update.py``).
    """
    mask = response_mask.to(logprobs.dtype)
    loss_norm, tokens = norms if norms is not None else (None, mask.sum().clamp(min=1))
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages = advantages.to(logprobs.dtype).expand_as(logprobs)
    low, high = clip_ratio if isinstance(clip_ratio, tuple) else (clip_ratio, clip_ratio)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    per_token = torch.maximum(pg1, pg2)
    dual = torch.zeros_like(mask)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c
        negative = advantages < 0
        dual = (negative & (per_token > bound)).to(mask.dtype)
        per_token = torch.where(negative, torch.minimum(per_token, bound), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights
    loss = aggregate(per_token, mask, loss_agg_mode, loss_norm)
    with torch.no_grad():
        metrics = {
            "pg_loss": float(loss),
            "pg_clipfrac": float(((pg2 > pg1).to(mask.dtype) * mask).sum() / tokens),
            "pg_clipfrac_lower": float((dual * mask).sum() / tokens),
            "ppo_kl": float((-log_ratio * mask).sum() / tokens),
        }
    return loss, metrics


Tokens = Sequence[int] | npt.NDArray[Any]
"""A row's token ids: a sample's numpy array, or a list."""
Logprobs = Sequence[float] | npt.NDArray[Any]


class Trajectory(NamedTuple):
    """One sampled response with what the update needs; a plain 4-tuple works as well."""

    prompt_ids: Tokens
    response_ids: Tokens
    response_logprobs: Logprobs
    advantage: float


@dataclass
class Batch:
    """Padded tensors for one update (see the module doc for the layout)."""

    input_ids: torch.Tensor
    """``[B, P + R]`` prompt (left-padded) then response (right-padded)."""
    attention_mask: torch.Tensor
    """``[B, P + R]`` 1 on real tokens."""
    position_ids: torch.Tensor
    """``[B, P + R]`` positions counting real tokens only."""
    response_mask: torch.Tensor
    """``[B, R]`` 1 on real response tokens (float)."""
    old_logprobs: torch.Tensor
    """``[B, R]`` logprobs the rollout recorded (0 on padding)."""
    advantages: torch.Tensor
    """``[B]`` one advantage per trajectory."""

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def build_batch(
    trajectories: Sequence[Trajectory | tuple[Tokens, Tokens, Logprobs, float]],
    pad_token_id: int,
) -> Batch:
    """Pad ``(prompt_ids, response_ids, response_logprobs, advantage)`` rows into a :class:`Batch`.

    The padded arrays are filled in numpy straight from each row's arrays (one copy, converted
    to the batch's types: int64 ids, float32 logprobs), then become tensors without a copy.
    """
    if not trajectories:
        raise ValueError("empty batch")
    rows = [Trajectory(*t) for t in trajectories]
    for t in rows:
        if len(t.response_ids) != len(t.response_logprobs):
            raise ValueError("response_ids and response_logprobs differ in length")
    bsz = len(rows)
    pw = max(len(t.prompt_ids) for t in rows)
    rw = max(max(len(t.response_ids) for t in rows), 1)
    input_ids = np.full((bsz, pw + rw), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((bsz, pw + rw), dtype=np.int64)
    response_mask = np.zeros((bsz, rw), dtype=np.float32)
    old_logprobs = np.zeros((bsz, rw), dtype=np.float32)
    for i, t in enumerate(rows):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, pw - p : pw] = t.prompt_ids
        attention_mask[i, pw - p : pw + r] = 1
        input_ids[i, pw : pw + r] = t.response_ids
        response_mask[i, :r] = 1.0
        old_logprobs[i, :r] = t.response_logprobs
    attention = torch.from_numpy(attention_mask)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.tensor([float(t.advantage) for t in rows], dtype=torch.float32)
    return Batch(
        torch.from_numpy(input_ids),
        attention,
        position_ids,
        torch.from_numpy(response_mask),
        torch.from_numpy(old_logprobs),
        advantages,
    )


MicroBatch = tuple[torch.Tensor | None, Batch]
"""The row indices of a micro-batch in its mini-batch (None: all of them), and its rows."""


def micro_batches(batch: Batch, size: int | None, max_tokens: int | None) -> list[MicroBatch]:
    """``batch``'s rows in micro-batches for gradient accumulation (verl's
    ``ppo_micro_batch_size_per_gpu``, or with ``max_tokens`` its ``use_dynamic_bsz`` and
    ``ppo_max_token_len_per_gpu``); neither: the whole batch, as it is.

    ``size``: consecutive rows, ``size`` at a time. ``max_tokens``: rows longest first, each
    micro-batch taking rows while its padded size (rows x the longest prompt + the longest
    response among them) stays within ``max_tokens`` (a row longer than that goes alone).
    Each micro-batch is cut to the columns its rows use, so its passes cost what its own
    tokens do; a row's logits do not change (positions count real tokens)."""
    if size is None and max_tokens is None:
        return [(None, batch)]
    width = batch.response_mask.shape[1]
    prompt_width = batch.input_ids.shape[1] - width
    prompt_lens = batch.attention_mask[:, :prompt_width].sum(-1).tolist()
    response_lens = batch.attention_mask[:, prompt_width:].sum(-1).tolist()
    rows = list(range(len(prompt_lens)))
    groups: list[list[int]] = []
    if max_tokens is None:
        assert size is not None
        groups = [rows[i : i + size] for i in range(0, len(rows), size)]
    else:
        rows.sort(key=lambda i: -(prompt_lens[i] + response_lens[i]))
        p = r = 0
        for i in rows:
            p2, r2 = max(p, prompt_lens[i]), max(r, response_lens[i], 1)
            if groups and (len(groups[-1]) + 1) * (p2 + r2) <= max_tokens:
                groups[-1].append(i)
                p, r = p2, r2
            else:
                groups.append([i])
                p, r = prompt_lens[i], max(response_lens[i], 1)
    out: list[MicroBatch] = []
    for group in groups:
        index = torch.tensor(group, device=batch.input_ids.device)
        p = max(prompt_lens[i] for i in group)
        r = max(max(response_lens[i] for i in group), 1)
        cols = slice(prompt_width - p, prompt_width + r)
        out.append(
            (
                index,
                Batch(
                    batch.input_ids[index, cols],
                    batch.attention_mask[index, cols],
                    batch.position_ids[index, cols],
                    batch.response_mask[index, :r],
                    batch.old_logprobs[index, :r],
                    batch.advantages[index],
                ),
            )
        )
    return out


def micro_logprobs(
    model: torch.nn.Module, batch: Batch, micro: list[MicroBatch], temperature: float
) -> torch.Tensor:
    """:func:`token_logprobs` of ``batch``, ``[B, R]``, one pass per micro-batch (no
    gradient: old or proximal log-probs)."""
    parts = [
        (
            index,
            token_logprobs(
                model, b.input_ids, b.attention_mask, b.position_ids, b.response_mask, temperature
            ),
        )
        for index, b in micro
    ]
    if parts[0][0] is None:  # the whole batch in one pass
        return parts[0][1]
    out = torch.zeros_like(batch.response_mask)
    for index, lp in parts:
        out[index, : lp.shape[1]] = lp.to(out.dtype)
    return out


def rollout_logprob_errors(
    model: torch.nn.Module,
    rows: Sequence[Trajectory | tuple[Tokens, Tokens, Logprobs, float]],
    pad_token_id: int,
    temperature: float,
) -> torch.Tensor:
    """``[B, R]`` |recorded - recomputed| logprob of each response token of ``rows`` (0 beyond
    a response), recomputed by :func:`token_logprobs` on ``model``'s device: how far a rollout
    engine's logprobs are from the trainer's (engine tests, ``bench engine``)."""
    batch = build_batch(rows, pad_token_id)
    device = next(model.parameters()).device
    with torch.no_grad():
        lp = token_logprobs(
            model,
            batch.input_ids.to(device),
            batch.attention_mask.to(device),
            batch.position_ids.to(device),
            batch.response_mask.to(device),
            temperature,
        )
    return (lp.float().cpu() - batch.old_logprobs).abs() * batch.response_mask
