"""A finished trajectory's reward on the rollout worker: the run's reward function called on
the decoded response, and its failures logged (the first few in full, then every 100th) and
counted. A failed trajectory is published with ``reward_error`` set, and the trainer does not
train on it (see ``reward``)."""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.config.sections import OverlongBufferConfig
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.reward import Reward, RewardCall, Scored
from asyncrl.schemas.prompt import PromptRecord

log = logging.getLogger(__name__)


def overlong_penalty(length: int, buffer: OverlongBufferConfig, max_resp_len: int) -> float:
    """DAPO's overlong reward shaping (verl's dapo reward manager): 0 up to ``max_resp_len -
    buffer.len`` response tokens, then falling linearly to ``-penalty_factor`` at
    ``max_resp_len``."""
    expected = max_resp_len - buffer.len
    return min(-(length - expected) / buffer.len * buffer.penalty_factor, 0.0)


class TrajectoryScorer:
    def __init__(
        self,
        reward: Reward,
        tokenizer: Any,
        worker_id: int,
        overlong: OverlongBufferConfig | None = None,
        max_resp_len: int = 0,
    ) -> None:
        self.reward = reward
        self.tokenizer = tokenizer
        self.worker_id = worker_id
        self.failures = 0
        self.overlong = overlong if overlong is not None and overlong.enable else None
        """DAPO's overlong penalty, added to each reward that did not fail (None: off)."""
        self.overlong_end = overlong.end(max_resp_len) if overlong is not None else max_resp_len
        """The length the penalty's buffer ends at."""

    def __call__(self, prompt: PromptRecord, state: AgentState, request_id: str) -> Scored:
        scored = self.reward(
            RewardCall(
                data_source=prompt.data_source,
                ground_truth=prompt.reward_ground_truth(),
                extra_info=prompt.reward_extra_info(),
                messages=state.messages,
                solution_str=self.tokenizer.decode(state.response_ids, skip_special_tokens=True),
                num_turns=1 + max(state.num_turns, 1),  # verl counts the prompt
            )
        )
        if self.overlong is not None and not scored.failed:
            penalty = overlong_penalty(len(state.response_ids), self.overlong, self.overlong_end)
            scored.score += penalty
            if self.overlong.log:
                scored.extra.update(overlong_reward=penalty, overlong=float(penalty < 0))
        if scored.failed:
            self.failures += 1
            n = self.failures
            if n <= 5 or n % 100 == 0:
                log.warning(
                    "worker %d: reward failure %d, %s: %s (published with reward_error set: "
                    "not trained on)",
                    *(self.worker_id, n, request_id, scored.error),
                )
        return scored

    def close(self) -> None:
        self.reward.close()
