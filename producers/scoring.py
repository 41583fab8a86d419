"""A finished trajectory's reward on the rollout worker: the run's reward function called on
the decoded response, and its failures logged (the first few in full, then every 100th) and
counted. A failed trajectory is published with ``reward_error`` set, and the trainer does not
train on it (see ``reward``).

With a pool (``reward_pool``, the custom reward function) :meth:`TrajectoryScorer.submit`
returns at once and the score comes back from :meth:`TrajectoryScorer.results`; without one
(the built-in rules, microseconds) it is computed inline and ready at the next ``results``."""

from __future__ import annotations

import logging
import time
from typing import Any

from asyncrl.config.sections import OverlongBufferConfig
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.reward import Reward, RewardCall, Scored
from asyncrl.producers.reward_pool import Result, RewardPool
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
        pool: RewardPool | None = None,
    ) -> None:
        self.reward = reward
        self.pool = pool
        """Where submitted calls run, off the caller's thread (None: inline)."""
        self._ready: list[Result] = []
        """Inline scores not taken by ``results`` yet."""
        self.tokenizer = tokenizer
        self.worker_id = worker_id
        self.failures = 0
        self.overlong = overlong if overlong is not None and overlong.enable else None
        """DAPO's overlong penalty, added to each reward that did not fail (None: off)."""
        self.overlong_end = overlong.end(max_resp_len) if overlong is not None else max_resp_len
        """The length the penalty's buffer ends at."""

    def _call(self, prompt: PromptRecord, state: AgentState) -> RewardCall:
        return RewardCall(
            data_source=prompt.data_source,
            ground_truth=prompt.reward_ground_truth(),
            extra_info=prompt.reward_extra_info(),
            messages=state.messages,
            solution_str=self.tokenizer.decode(state.response_ids, skip_special_tokens=True),
            num_turns=1 + max(state.num_turns, 1),  # verl counts the prompt
            turn_scores=list(state.turn_scores),
        )

    def __call__(self, prompt: PromptRecord, state: AgentState, request_id: str) -> Scored:
        """Score inline (whatever the pool)."""
        scored = self.reward(self._call(prompt, state))
        return self._finish(scored, len(state.response_ids), request_id)

    @property
    def pending(self) -> int:
        """Submitted calls whose result ``results`` has not returned yet."""
        return len(self._ready) + (self.pool.pending if self.pool is not None else 0)

    def submit(self, key: Any, prompt: PromptRecord, state: AgentState, request_id: str) -> None:
        """Score a trajectory (on the pool if there is one); ``results`` returns it with
        ``key``. The response is decoded here, on the caller's thread."""
        call = self._call(prompt, state)
        tag = (key, len(state.response_ids), request_id)
        if self.pool is not None:
            self.pool.submit(tag, call)
            return
        t0 = time.perf_counter()
        self._ready.append((tag, self.reward(call), time.perf_counter() - t0))

    def results(self, timeout: float = 0.0) -> list[Result]:
        """``(key, score, seconds)`` of each submitted call done by now (waiting up to
        ``timeout`` for one while none is), overlong penalty added, failures counted."""
        done, self._ready = self._ready, []
        if self.pool is not None:
            done += self.pool.results(0.0 if done else timeout)
        out: list[Result] = []
        for tag, scored, seconds in done:
            key, length, request_id = tag
            out.append((key, self._finish(scored, length, request_id), seconds))
        return out

    def _finish(self, scored: Scored, length: int, request_id: str) -> Scored:
        if self.overlong is not None and not scored.failed:
            penalty = overlong_penalty(length, self.overlong, self.overlong_end)
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
        if self.pool is not None:
            self.pool.close()  # the reward is one of the pool's
        else:
            self.reward.close()
