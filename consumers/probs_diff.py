"""The rollout-vs-trainer probability gap of a step: verl's ``training/rollout_probs_diff_*``.

For every trained response token, ``|exp(b_t) - exp(p_t)|``: ``b_t`` the log-prob the rollout
engine recorded when it sampled the token, ``p_t`` the trainer's recomputation of it (the old
log-probs, or the proximal ones of decoupled PPO), both at the rollout temperature. verl logs
the max, mean and (unbiased) std of these over the batch's response tokens
(``verl/trainer/ppo/ray_trainer.py`` and ``verl/utils/debug/metrics.py``,
``calculate_debug_metrics``). Only a step whose trainer recomputes the log-probs has them:
with ``async_training.use_rollout_log_probs=true`` (the default) and no
``compute_prox_log_prob`` the trainer takes the rollout's as they are, and there is no second
number to compare.

What the gap measures: an engine whose logprobs are the trainer's (same weights, fp32) gives
float noise; a stale token (sampled under older weights than the trainer's now) adds the
policy's drift; a wrong engine (logprobs before the temperature, a KV block from old weights)
shows up here first.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

PREFIX = "training/rollout_probs_diff_"
NAMES = tuple(PREFIX + s for s in ("max", "mean", "std"))
"""verl's names, in the order max, mean, std."""


def probs_diff(trainer: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``|exp(rollout) - exp(trainer)|`` of each token where ``mask`` is set, flat, float64 on
    the CPU (``[B, R]`` log-probs and mask)."""
    diff = (torch.exp(rollout.double()) - torch.exp(trainer.double())).abs()
    return diff[mask.bool()].cpu()


def probs_diff_metrics(
    diffs: list[torch.Tensor], group: ProcessGroup | None = None
) -> dict[str, float]:
    """verl's max, mean and std of the gaps of a step's mini-batches (``probs_diff``'s); with
    ``group`` (sharded ranks) over every rank's tokens (every rank calls it). No token: {}."""
    flat = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    top = flat.max() if flat.numel() else torch.tensor(-math.inf, dtype=torch.float64)
    sums = torch.stack(
        [flat.sum(), (flat * flat).sum(), torch.tensor(flat.numel(), dtype=torch.float64)]
    )
    if group is not None:
        import torch.distributed as dist

        top = top.reshape(1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(sums, group=group)
    total, squares, n = sums.tolist()
    if n == 0:
        return {}
    mean = total / n
    var = max(0.0, squares - n * mean * mean) / (n - 1) if n > 1 else 0.0
    return dict(zip(NAMES, (float(top.reshape(())), mean, math.sqrt(var)), strict=True))
