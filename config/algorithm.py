"""The ``algorithm`` section: the advantage estimator and the reward and sample shaping around it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import Strict
from asyncrl.config.offpolicy import FilterGroupsConfig, RolloutCorrectionConfig


class OverlongBufferConfig(Strict):
    """DAPO's overlong reward shaping (verl's dapo reward manager, its
    ``reward_kwargs.overlong_buffer_cfg``): a response longer than max_resp_len - len tokens
    loses (length - (max_resp_len - len)) / len x penalty_factor of reward, at most
    penalty_factor at max_resp_len, so the policy learns to finish before the cap instead of
    being cut there."""

    enable: bool = False
    """Apply the penalty to every rollout's reward (held-out evaluations score without it)."""
    len: int = Field(4096, ge=1)
    """The buffer: the last tokens before max_resp_len over which the penalty grows."""
    penalty_factor: float = Field(1.0, ge=0, le=1e6)
    """The penalty at max_resp_len (it grows linearly across the buffer)."""
    log: bool = False
    """Log reward/overlong_reward/mean (the penalty) and reward/overlong/mean (the share
    penalised) per step."""
    max_resp_len: int | None = Field(None, ge=1)
    """The length the buffer ends at (verl's reward_kwargs.max_resp_len); None:
    data.max_response_length."""

    def end(self, max_response_length: int) -> int:
        """The length the buffer ends at, given data.max_response_length."""
        return self.max_resp_len or max_response_length


class AlgorithmConfig(Strict):
    adv_estimator: Literal["grpo"] = "grpo"
    """Advantage estimator: GRPO (group-relative, no critic)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-relative advantages by the group's std (GRPO) or not (Dr. GRPO)."""
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig)
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)
