"""Reward calls off the rollout worker's decoding loop: ``custom_reward_function.num_workers``
calls at once, each on a thread of its own with a reward of its own (for ``CustomReward``, its
own child process), so the engine keeps decoding while a slow reward (a sandbox, a verifier, an
LLM judge) is computed. A call's failures and timeouts are the reward's, as inline
(``reward``); a call that raises here is a reward failure too, never a lost result.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.producers.reward import Reward, RewardCall, Scored

Result = tuple[Any, Scored, float]
"""(the caller's key, the score, the call's seconds)."""


class RewardPool:
    def __init__(self, rewards: list[Reward]) -> None:
        assert rewards, "a pool needs at least one reward"
        self.size = len(rewards)
        self._free: queue.SimpleQueue[Reward] = queue.SimpleQueue()
        for reward in rewards:
            self._free.put(reward)
        self._rewards = rewards
        self._done: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        self._threads = ThreadPoolExecutor(self.size, thread_name_prefix="reward")

    @property
    def pending(self) -> int:
        """Calls submitted whose result has not been taken by :meth:`results` yet."""
        with self._lock:
            return self._pending

    def submit(self, key: Any, call: RewardCall) -> None:
        """Score ``call`` on the next free reward; its result comes back with ``key``."""
        with self._lock:
            self._pending += 1
        self._threads.submit(self._run, key, call)

    def _run(self, key: Any, call: RewardCall) -> None:
        reward = self._free.get()  # as many threads as rewards: one is free
        t0 = time.perf_counter()
        try:
            scored = reward(call)
        except Exception as err:  # the pool closed under the call, or a bug: still a result
            why = "the worker is leaving" if self._closed else f"{type(err).__name__}: {err}"
            scored = Scored(0.0, error=f"the reward call failed ({why})")
        finally:
            self._free.put(reward)
        self._done.put((key, scored, time.perf_counter() - t0))

    def results(self, timeout: float = 0.0) -> list[Result]:
        """The calls finished so far, waiting up to ``timeout`` seconds for a first one if
        none has and some are pending."""
        out: list[Result] = []
        try:
            if timeout > 0 and self.pending:
                out.append(self._done.get(timeout=timeout))
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        with self._lock:
            self._pending -= len(out)
        return out

    def close(self) -> None:
        """Kill the rewards' children (a call under way ends as a failure nobody reads) and
        let the threads go."""
        self._closed = True
        self._threads.shutdown(wait=False, cancel_futures=True)
        for reward in self._rewards:
            reward.close()


def make_pool(cfg: RunConfig, reward: Reward) -> RewardPool | None:
    """The pool of a custom reward function (``reward`` and ``num_workers - 1`` more, whose
    children start at their first call), or None for the built-in rules, scored inline."""
    from asyncrl.producers.reward import CustomReward

    if not isinstance(reward, CustomReward):
        return None
    more = [CustomReward(cfg) for _ in range(cfg.custom_reward_function.num_workers - 1)]
    return RewardPool([reward, *more])
