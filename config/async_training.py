"""The ``async_training`` section: staleness, the sync cadence and partial rollout (verl's keys)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import Strict


class AsyncTrainingConfig(Strict):
    staleness_threshold: float = Field(0.5, ge=0, le=1e6)
    """Extra share of samples the rollout may produce per version (0 = synchronous streaming;
    at most 1e6, so the sample budget stays an integer)."""
    trigger_parameter_sync_step: int = Field(1, ge=1)
    """Local trainer updates between two weight syncs."""
    require_batches: int = Field(1, ge=1, le=4096)
    """Mini-batches gathered before one update: a step uses require_batches x ppo_mini_batch_size
    samples (at most 4096)."""
    partial_rollout: bool = False
    """Interrupt in-flight samples at a sync and continue them (only with staleness_threshold > 0)."""
    use_trainer_do_validate: bool = True
    """Who runs the held-out evaluation every trainer.test_freq steps: the trainer (True), or
    rollout worker 0 once it has loaded the first weights at or past such a step (False,
    verl's default: the trainer never stops for it; each result reaches it as a Validated event
    and lands in the metrics row of the step it is at then). The final evaluation is the
    trainer's either way. It generates on the rollout's kind of engine: with rollout.name=vllm,
    worker 0's own vLLM engine (greedy; a sampled one on hf_cached, beside it), or the
    trainer's evaluation vLLM engine (started at its first evaluation, its weights loaded
    before each)."""
    in_flight_update: bool = False
    """With partial_rollout: workers receive each version's weights in the background while they
    keep generating, and swap them in between two tokens (PipelineRL's in-flight weight update):
    no pause, nothing logged to partials at a sync; the tokens after the swap form a new segment
    under the new version. The trainer does not wait for the workers to pause."""
    use_rollout_log_probs: bool = True
    """Use the rollout's logprobs as old_log_prob (verl's default); False recomputes with the trainer."""
    compute_prox_log_prob: bool = False
    """Decoupled PPO (AReaL; verl's experimental key): before each step's first update the
    trainer computes every token's log-prob under its current weights (the proximal policy);
    the PPO ratio is taken against it (use_rollout_log_probs then has no effect), and
    rollout_corr/* logs its mismatch with the rollout's. With the importance weight
    behaviour -> proximal (algorithm.rollout_correction.rollout_is=token) this is the seed's
    mode (d) recipe."""
    max_version_lag: int | None = Field(None, ge=0)
    """Drop samples with current_version - param_version > this (counted, reported). None: keep all."""
    max_token_version_lag: int | None = Field(None, ge=0)
    """Per token: response tokens generated more than this many versions before the trainer's
    (the segments of a partial rollout carry their versions) leave the loss, as
    stale_token_action says. None: every token is trained."""
    stale_token_action: Literal["mask", "drop"] = "mask"
    """What max_token_version_lag does to a trajectory with such tokens: mask (only those
    tokens leave the loss; the newer segments are trained) or drop (the whole trajectory leaves
    the loss; it still counts in its group's advantage baseline)."""

    @property
    def mode(self) -> str:
        """The seed's mode letter: a on-policy, b stream off-policy, c stale, d partial."""
        if self.staleness_threshold == 0:
            return "a" if self.trigger_parameter_sync_step == 1 else "b"
        return "d" if self.partial_rollout else "c"
