"""DAPO's overlong reward shaping (algorithm.overlong_buffer; verl's dapo reward manager's
reward_kwargs.overlong_buffer_cfg) against values worked out by hand."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.config.sections import OverlongBufferConfig
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.reward import Scored
from asyncrl.producers.scoring import TrajectoryScorer, overlong_penalty
from asyncrl.schemas.prompt import PromptRecord


def test_the_penalty_grows_across_the_buffer():
    """max_resp_len 20, buffer 8 (from 12 tokens on), factor 0.5."""
    buffer = OverlongBufferConfig(enable=True, len=8, penalty_factor=0.5)
    assert overlong_penalty(12, buffer, 20) == 0.0
    assert overlong_penalty(16, buffer, 20) == pytest.approx(-0.25)
    assert overlong_penalty(20, buffer, 20) == pytest.approx(-0.5)
    assert overlong_penalty(5, buffer, 20) == 0.0


class _Fixed:
    def __init__(self, scored: Scored):
        self.scored = scored

    def __call__(self, call):
        return Scored(self.scored.score, dict(self.scored.extra), self.scored.error)

    def close(self):
        pass


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


def _score(reward: Scored, length: int, **buffer) -> Scored:
    scorer = TrajectoryScorer(
        _Fixed(reward), _Tokenizer(), 0, overlong=OverlongBufferConfig(**buffer), max_resp_len=20
    )
    state = AgentState([1, 2])
    state.response_ids = list(range(3, 3 + length))
    prompt = PromptRecord(prompt_id="p0", prompt="1+1=", ground_truth="2")
    return scorer(prompt, state, "r0")


def test_a_rollouts_reward_takes_the_penalty_and_logs_it():
    scored = _score(Scored(1.0), 16, enable=True, len=8, penalty_factor=0.5, log=True)
    assert scored.score == pytest.approx(0.75)
    assert scored.extra == {"overlong_reward": pytest.approx(-0.25), "overlong": 1.0}
    assert _score(Scored(1.0), 16, enable=False, len=8).score == 1.0
    failed = _score(Scored(0.0, error="boom"), 20, enable=True, len=8)
    assert failed.score == 0.0  # a failed reward stays a failure, not a penalised 0


def test_verls_dapo_keys_load():
    cfg = load_config(
        overrides=[
            "data.max_response_length=64",
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=16",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
            "+reward_model.reward_kwargs.max_resp_len=64",
        ],
    )
    buffer = cfg.algorithm.overlong_buffer
    assert buffer.enable and buffer.len == 16 and buffer.max_resp_len == 64
    older = load_config(
        overrides=["reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4"]
    )
    assert older.algorithm.overlong_buffer.enable and older.algorithm.overlong_buffer.len == 4
    with pytest.raises(ConfigError, match="overlong_buffer.len=4096 is not below"):
        load_config(overrides=["algorithm.overlong_buffer.enable=true"])  # 4096 >= the demo's 6
