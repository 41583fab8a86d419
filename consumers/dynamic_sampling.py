"""DAPO's dynamic sampling (verl's ``algorithm.filter_groups``), as a stream filter.

DAPO (verl's ``recipe/dapo/dapo_ray_trainer.py``) drops the groups whose trajectories' metric
has ``np.std == 0`` (groups of one are kept), then generates further batches until
``train_batch_size`` prompts are left, failing after ``max_num_gen_batches``. Here the trainer
reads a stream, so the filter runs as each sample arrives (``SampleBatcher.offer``):

* a filtered sample is settled at once: published as ``SamplesDropped`` naming it with a
  ``filter_groups:`` reason, refunding no one and not counted as consumed, because its worker
  ran the same test as it published the group and took the slot back then (without that, a
  run at ``staleness_threshold=0`` would wait forever for the samples its filtered groups
  took; ``producers/in_flight.py``);
* the step waits until ``required_samples`` samples are kept, the batch is these;
* a filtered sample counts towards the first kept sample after it on the log (per step:
  ``filter_groups/filtered_groups``, DAPO's ``train/num_gen_batches``), and the trainer fails
  as DAPO does once one step has read ``max_num_gen_batches x required_samples`` samples
  without enough kept.
"""

from __future__ import annotations

import json
import math

import numpy as np

from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.consumers.exit_codes import ExitCode
from asyncrl.schemas.sample import Sample

REASON = "filter_groups"
"""The prefix of the SamplesDropped reason of a filtered group (and the batcher's drop kind)."""
REWARD_METRICS = (None, "score", "seq_reward", "seq_final_reward")
"""verl's names that mean the trajectory's reward here (no KL penalty in the reward)."""


def metric_values(sample: Sample, metric: str | None) -> list[float]:
    """The group's ``metric``, one per trajectory whose reward did not fail."""
    out = []
    for i, t in enumerate(sample.trajectories):
        if t.reward_failed:
            continue
        if metric in REWARD_METRICS:
            out.append(float(t.reward))
            continue
        extra = json.loads(t.reward_extra) if t.reward_extra else {}
        if metric not in extra:
            raise ValueError(
                f"algorithm.filter_groups.metric={metric}: trajectory {i} of sample "
                f"{sample.sample_id} has no {metric!r} (its reward function returned "
                f"{sorted(extra) or 'a float'}); use score, or return {metric!r} in the dict"
            )
        out.append(float(extra[metric]))
    return out


def no_signal(sample: Sample, cfg: FilterGroupsConfig) -> str | None:
    """Why the group is filtered (every trajectory's metric equal), or None to keep it.
    Kept as DAPO keeps them: a group of one trajectory. A group with one scored trajectory
    of several (the others' rewards failed) has advantage 0 too: filtered."""
    if len(sample.trajectories) == 1:
        return None
    values = metric_values(sample, cfg.metric)
    if len(values) >= 2 and float(np.std(values)) > 0:
        return None
    name = cfg.metric or "score"
    shown = f"{values[0]:g}" if values else "failed"
    return f"{REASON}: every trajectory's {name} is {shown} (advantage 0, no signal)"


def filter_metrics(filtered: int, kept: int, total: int) -> dict[str, float]:
    """A step's dynamic-sampling figures: the groups filtered on the way to its ``kept``
    samples, their share of those read, DAPO's ``train/num_gen_batches`` (batches of ``kept``
    samples read to fill the step), and the run's total filtered."""
    read = filtered + kept
    return {
        "filter_groups/filtered_groups": float(filtered),
        "filter_groups/filtered_ratio": filtered / read if read else 0.0,
        "train/num_gen_batches": float(math.ceil(read / kept)) if kept else 0.0,
        "fully_async/count/filtered_samples": float(total),
    }


class GenBatchesExhausted(RuntimeError):
    """``max_num_gen_batches`` reached: a limit the config sets, so the run ends, as DAPO's.
    A restarted trainer would only try again on the same prompts under the same policy (one
    did, and its run then finished as if the limit held), so the trainer exits with
    ``EXIT_CODE`` and the launcher does not restart it."""

    EXIT_CODE = ExitCode.GAVE_UP


def check_gen_batches(
    fg: FilterGroupsConfig, queued: int, filtered: int, n: int, step: int
) -> None:
    """DAPO's ``max_num_gen_batches``: fail once filling ``step`` (of ``n`` samples, ``queued``
    kept so far, ``filtered`` left out since the last step) has read that many batches' worth
    of samples and still lacks some."""
    if fg.max_num_gen_batches <= 0:
        return
    kept = min(queued, n)
    if kept < n and kept + filtered >= fg.max_num_gen_batches * n:
        raise GenBatchesExhausted(
            f"algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}: step "
            f"{step} read {kept + filtered} samples, filtered {filtered} (every "
            f"trajectory's {fg.metric or 'score'} equal) and kept {kept} of {n}: the prompts "
            "may be too easy or too hard for the policy (0: no limit)"
        )
