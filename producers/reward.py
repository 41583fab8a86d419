"""The reward of a finished trajectory, computed by the rollout worker (reward during rollout).

Two kinds, chosen by the config (:func:`make_reward`):

* :class:`BuiltinReward`: the rule of a shipped task (``data.task``; with dataset files, the
  task named by each prompt's ``data_source``).
* :class:`CustomReward`: verl's ``custom_reward_function``: ``name(data_source, solution_str,
  ground_truth, extra_info=None, **reward_kwargs) -> float | dict`` from the file at ``path``,
  run in a child process (``reward_server.py``) that imports the file once. A call gets at
  most ``timeout_s``; one that raises, returns something else than a number (or a dict with
  ``"score"``), or times out (the child is killed and restarted) is a **reward failure**.

A reward failure is never a silent 0: :class:`Scored` carries ``error``, the worker logs it,
counts it and publishes the trajectory with ``reward_error`` set (``reward`` 0). The trainer
leaves such trajectories out of the update (no advantage, no token trained on: the rest of
the group is compared among itself) and reports ``reward/failures`` per step.

``solution_str`` is the response decoded with special tokens skipped, as verl's reward
manager does (with the agent loop: every response token, tool responses included);
``extra_info`` is the row's, plus ``num_turns`` and the interaction's ``turn_scores`` (verl's
reward managers add both: its agent loop's ``turn_scores`` reach ``extra_info`` with the
other fields the loop returns).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl.config import ConfigError, RunConfig

log = logging.getLogger(__name__)


@dataclass
class RewardCall:
    """What one trajectory's reward is computed from."""

    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    messages: list[dict[str, str]]
    """The conversation after the prompt (the agent loop's messages)."""
    solution_str: str
    """The decoded response (special tokens skipped)."""
    num_turns: int = 2
    turn_scores: list[float] = field(default_factory=list)
    """The interaction's score of each reply (``AgentState.turn_scores``)."""


@dataclass
class Scored:
    score: float
    extra: dict[str, float] = field(default_factory=dict)
    error: str = ""
    """Why the reward function failed; empty when it did not (``score`` is then 0)."""

    @property
    def failed(self) -> bool:
        return bool(self.error)


class Reward(Protocol):
    def __call__(self, call: RewardCall) -> Scored: ...

    def close(self) -> None: ...


class BuiltinReward:
    """The shipped tasks' rule: ``data.task`` for the built-in prompts, each prompt's
    ``data_source`` for dataset files (checked at start-up to name a shipped task)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.task = None if cfg.data.from_files else cfg.data.task

    def __call__(self, call: RewardCall) -> Scored:
        from asyncrl.tasks import score

        task = self.task or call.data_source
        return Scored(score(task, str(call.ground_truth), call.messages))

    def close(self) -> None:
        pass


class RewardLoadError(ConfigError):
    """The custom reward function cannot be loaded; the message names the key."""


class CustomReward:
    """verl's custom reward function, in a child process, with a timeout per call."""

    def __init__(self, cfg: RunConfig) -> None:
        crf = cfg.custom_reward_function
        assert crf.path is not None
        self.path, self.name = crf.path, crf.name
        self.timeout_s = crf.timeout_s
        self.kwargs = dict(crf.reward_kwargs)
        self.proc: subprocess.Popen | None = None
        self.failures = 0
        """Calls that failed (raised, timed out, returned no number)."""

    # --- the child ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the child and wait for it to load the function; RewardLoadError names the key
        (a missing file: custom_reward_function.path, a missing function: .name)."""
        self.close()
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "asyncrl.producers.reward_server", self.path, self.name),
                json.dumps(sorted(self.kwargs)),  # checked against the function's signature
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line = self._read_line(max(60.0, self.timeout_s))
        hello = json.loads(line) if line else None
        if not hello or not hello.get("ok"):
            self.close()
            if hello is None:
                raise RewardLoadError(
                    f"custom_reward_function.path: {self.path}: the reward process did not "
                    "start (see the log above)"
                )
            raise RewardLoadError(f"{hello['key']}: {hello['error']}")

    def _read_line(self, timeout_s: float) -> bytes | None:
        """One line from the child within ``timeout_s``; None on timeout, b"" if it ended."""
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        return self.proc.stdout.readline()

    def _exit_status(self) -> str:
        """How the child ended, once its output closed: the call that killed it (os._exit,
        sys.exit, a crash in native code, the OOM killer) is said so, not called a timeout."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "its output closed"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def close(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    # --- one call -------------------------------------------------------------------------------
    def __call__(self, call: RewardCall) -> Scored:
        scored = self._call(call)
        if scored.failed:
            self.failures += 1
        return scored

    def _call(self, call: RewardCall) -> Scored:
        if self.proc is None or self.proc.poll() is not None:
            self.start()  # the first call, or the one after a timeout or a crash
        assert self.proc is not None and self.proc.stdin is not None
        kwargs = {
            "data_source": call.data_source,
            "solution_str": call.solution_str,
            "ground_truth": call.ground_truth,
            "extra_info": {
                **call.extra_info,
                "num_turns": call.num_turns,
                "turn_scores": call.turn_scores,
            },
            **self.kwargs,
        }
        try:
            self.proc.stdin.write((json.dumps({"kwargs": kwargs}, default=str) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            self.close()
            return Scored(0.0, error=f"the reward process died ({err})")
        t0 = time.monotonic()
        line = self._read_line(self.timeout_s)
        if not line:
            # its output ended: the process died (a poll() here could still miss its exit)
            how = self._exit_status() if line is not None else ""
            self.close()  # a stuck call is killed with its process; the next call restarts it
            if how:
                return Scored(0.0, error=f"the reward process died during the call ({how})")
            return Scored(
                0.0,
                error=f"timed out after {time.monotonic() - t0:.1f} s "
                f"(custom_reward_function.timeout_s={self.timeout_s:g})",
            )
        reply = json.loads(line)
        if "error" in reply:
            return Scored(0.0, error=reply["error"])
        return Scored(float(reply["score"]), dict(reply.get("extra") or {}))


def make_reward(cfg: RunConfig) -> Reward:
    """The run's reward: the custom function (started and loaded now) or the built-in rule."""
    if cfg.custom_reward_function.path is None:
        return BuiltinReward(cfg)
    reward = CustomReward(cfg)
    reward.start()
    return reward


def check_reward_function(cfg: RunConfig) -> tuple[str, str] | None:
    """``(key, why)`` if the custom reward function cannot be loaded (start-up check), or None."""
    if cfg.custom_reward_function.path is None:
        return None
    reward = CustomReward(cfg)
    try:
        reward.start()
    except RewardLoadError as err:
        key, _, why = str(err).partition(": ")
        return key, why
    finally:
        reward.close()
    return None
