"""Interactions (simulated users) configured as verl configures them: the YAML file loads
or fails naming the file, entry and key; each sample picks its interaction by
``extra_info.interaction_kwargs.name``; the shipped example interaction; and an interaction
that fails mid-run ends its trajectory (``interaction_error``) instead of the worker."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import asyncrl
from asyncrl.config import ConfigError, ModelConfig, load_config
from asyncrl.kafka.record import Record
from asyncrl.launch.preflight import check_startable
from asyncrl.models.tiny import CHARS, build_model, build_tokenizer
from asyncrl.producers.agent.data import checked_rows
from asyncrl.producers.agent.interaction import (
    ConfiguredInteractions,
    InteractionConfigError,
    InteractionError,
    load_interactions,
)
from asyncrl.producers.agent.loop import AgentLimits, AgentLoop
from asyncrl.producers.agent.parser import CompactParser
from asyncrl.producers.agent.retry_interaction import RetryInteraction
from asyncrl.producers.agent.runner import AgentRunner
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.engines.base import GenResult
from asyncrl.producers.engines.hf import HFEngine
from asyncrl.producers.in_flight import InFlight
from asyncrl.producers.reward import RewardCall, Scored
from asyncrl.producers.scoring import TrajectoryScorer
from asyncrl.producers.tools.calculator import CalculatorTool
from asyncrl.producers.tools.registry import ToolExecutor
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.tasks import calculator as calc

SHIPPED = Path(asyncrl.__file__).parent / "configs" / "interactions" / "retry.yaml"
KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
RETRY = "asyncrl.producers.agent.retry_interaction.RetryInteraction"


def test_the_shipped_example_loads_and_an_entry_without_a_name_gets_verls_default(tmp_path):
    (retry,) = load_interactions(SHIPPED).values()
    assert isinstance(retry, RetryInteraction) and retry.config == {
        "max_retries": 1,
        "name": "retry",
    }
    path = tmp_path / "i.yaml"
    path.write_text(f"interaction:\n  - class_name: {RETRY}\n")  # no name, no config
    assert list(load_interactions(path)) == ["retry"]  # RetryInteraction, less Interaction


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("interaction: []", "expected a non-empty list under 'interaction'"),
        ("interaction: [", "not valid YAML"),
        ("interaction:\n  - name: x", "interaction[0].class_name: missing"),
        ("interaction:\n  - class_name: no.such.Thing", "interaction[0].class_name: cannot import"),
        (f"interaction:\n  - class_name: {RETRY}\n    confg: {{}}", "confg: unknown key"),
        (
            f"interaction:\n  - class_name: {RETRY}\n    config: {{max_retries: -1}}",
            "interaction[0]: RetryInteraction(config=...) raised ValueError: config.max_retries",
        ),
        (
            f"interaction:\n  - class_name: {RETRY}\n  - class_name: {RETRY}",
            "interaction[1].name: 'retry' twice",
        ),
        (
            "interaction:\n  - class_name: asyncrl.producers.tools.base.ToolCall",
            "needs an async def generate_response",
        ),
    ],
)
def test_a_bad_interaction_config_fails_naming_the_entry_and_key(tmp_path, text, message):
    path = tmp_path / "interactions.yaml"
    path.write_text(text)
    with pytest.raises(InteractionConfigError) as err:
        load_interactions(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_an_interaction_module_that_fails_as_it_is_imported_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "my_users.py").write_text("raise RuntimeError('no API key')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_users", raising=False)
    path = tmp_path / "interactions.yaml"
    path.write_text("interaction:\n  - class_name: my_users.User\n")
    with pytest.raises(InteractionConfigError) as err:
        load_interactions(path)
    assert str(err.value) == (
        f"{path}: interaction[0].class_name: importing 'my_users' raised RuntimeError: no API key"
    )


def _agent(*overrides: str) -> list[str]:
    return ["actor_rollout_ref.rollout.multi_turn.enable=true", *overrides]


def test_verls_key_is_read_and_checked_at_start_up(tmp_path):
    """asyncrl refused the key ("ships no interaction yet") though its loop takes one."""
    cfg = load_config("calculator", overrides=[f"{KEY}={SHIPPED}"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path == str(SHIPPED)
    missing = load_config("calculator", overrides=[f"{KEY}={tmp_path / 'nope.yaml'}"])
    with pytest.raises(ConfigError, match=f"{KEY}: {tmp_path / 'nope.yaml'}: cannot read it"):
        check_startable(missing, "rollout")
    two = tmp_path / "two.yaml"
    two.write_text(f"interaction:\n  - class_name: {RETRY}\n  - name: b\n    class_name: {RETRY}\n")
    several = load_config("calculator", overrides=[f"{KEY}={two}"])
    with pytest.raises(ConfigError, match=r"interactions retry, b, and data.task=calculator's"):
        check_startable(several, "rollout")
    with pytest.raises(ConfigError, match=f"{KEY} needs .*multi_turn.enable=true"):
        load_config(overrides=[f"{KEY}={SHIPPED}"])


def test_a_row_naming_an_unknown_interaction_fails_at_load_naming_it(tmp_path):
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": "07+35="}],
            "reward_model": {"ground_truth": "42"},
            "extra_info": {"interaction_kwargs": {"name": name, "ground_truth": "42"}},
        }
        for name in ("retry", "retyr")
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = load_config(
        overrides=_agent(
            f"data.train_files={path}",
            f"data.val_files={path}",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            f"{KEY}={SHIPPED}",
        )
    )
    with pytest.raises(ConfigError) as err:
        checked_rows(cfg, "train")
    assert str(err.value) == (
        "data.train_files: prompt train-1: extra_info.interaction_kwargs.name: 'retyr' is not "
        f"in {KEY} (it has retry)"
    )


def _rows_file(path: Path, extra_info: dict) -> None:
    """A data file of one row with ``extra_info``."""
    row = {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": "07+35="}],
        "reward_model": {"ground_truth": "42"},
        "extra_info": extra_info,
    }
    pq.write_table(pa.Table.from_pylist([row]), path)


MISSING = "extra_info.interaction_kwargs.name: missing"


@pytest.mark.parametrize(
    ("configured", "expected"),
    [(["retry"], [None, None, None]), (["retry", "b"], [MISSING, MISSING, None])],
)
def test_the_data_check_and_the_workers_pick_a_rows_interaction_by_one_rule(
    tmp_path, configured, expected
):
    """A row with interaction_kwargs but no name, under one interaction, was picked by the
    workers (ConfiguredInteractions) but refused by the data check at load: two copies of
    the rule. Now both ask files.pick_interaction, and agree on every row."""
    config = tmp_path / "users.yaml"
    config.write_text(
        "interaction:\n"
        + "".join(f"  - name: {name}\n    class_name: {RETRY}\n" for name in configured)
    )
    users = ConfiguredInteractions(load_interactions(config))
    rows = [
        {"ground_truth": "42"},  # kwargs without a name: the row the two rules disagreed on
        None,  # no kwargs at all (the built-in tasks' rows)
        {"name": "retry", "ground_truth": "42"},
    ]
    path = tmp_path / "train.parquet"
    overrides = _agent(f"data.train_files={path}", f"data.val_files={path}", f"{KEY}={config}")
    cfg = load_config(overrides=[*overrides, "actor_rollout_ref.rollout.multi_turn.format=hermes"])
    verdicts = []
    for kwargs in rows:
        _rows_file(path, {"index": 0} if kwargs is None else {"interaction_kwargs": kwargs})
        try:
            checked_rows(cfg, "train")
            at_load = None
        except ConfigError as err:
            at_load = str(err).removeprefix("data.train_files: prompt train-0: ")
        try:
            picked = users._pick(AgentState(prompt_ids=[1], interaction_kwargs=kwargs or {}))
            at_run = None
        except InteractionError as err:
            at_run = str(err)
        assert at_load == at_run, kwargs
        if at_run is None:
            assert picked is users.interactions["retry"]
        verdicts.append(at_run and at_run.split(";")[0])
    assert verdicts == expected


TRY_AGAIN = "Your answer is incorrect. Try again."


def test_the_example_says_right_or_wrong_and_lets_the_model_retry_once():
    retry = RetryInteraction({"name": "retry", "max_retries": 1})
    prompt = [{"role": "user", "content": "What is 347*86?"}]

    def reply(*turns: str) -> tuple:  # the model's turns; "=..." a tool's response
        messages = list(prompt)
        for turn in turns:  # each answer but the last got the retry, as in a trajectory
            if messages[-1]["role"] == "assistant" and not messages[-1]["content"].startswith("["):
                messages.append({"role": "user", "content": TRY_AGAIN})
            role = "tool" if turn.startswith("=") else "assistant"
            messages.append({"role": role, "content": turn})
        return asyncio.run(retry.generate_response("r", messages, ground_truth="29842"))

    assert reply("It is 29,842.")[:3] == (True, "Your answer is correct.", 1.0)
    assert reply("30000")[:3] == (False, TRY_AGAIN, 0.0)
    assert reply("30000", "29842")[:2] == (True, "Your answer is correct.")
    assert reply("30000", "29000")[:2] == (True, "Your answer is incorrect.")
    # A turn that called a tool is no answer: the first answer after it gets its retry
    # (counted as assistant messages, a calculator user got none: 66 of 157 replies on the
    # calculator data's held-out rows ended a trajectory at its first answer).
    assert reply("[347*86]", "=29842", "29000")[:2] == (False, TRY_AGAIN)
    assert reply("[347*86]", "=29842", "29000", "29800")[:2] == (True, "Your answer is incorrect.")


class _Recording:
    """A reward that keeps the calls it is asked to score (what a reward function is given)."""

    def __init__(self) -> None:
        self.calls: list[RewardCall] = []

    def __call__(self, call: RewardCall) -> Scored:
        self.calls.append(call)
        return Scored(1.0)

    def close(self) -> None:
        pass


def test_an_interactions_turn_scores_reach_the_sample_and_the_reward_function():
    """verl keeps the score generate_response returns with each reply (turn_scores) and hands
    it to the reward (extra_info); asyncrl dropped it. Now the loop keeps it in the state
    (logged with partials), the trajectory carries it, and the reward call gets it."""
    tok = build_tokenizer(CHARS + calc.TOOL_CHARS)
    users = ConfiguredInteractions(load_interactions(SHIPPED))  # scores 0.0 wrong, 1.0 right
    limits = AgentLimits(response_length=128)  # room for the replies (a token a character)
    loop = AgentLoop(tok, CompactParser(CalculatorTool()), limits, users)
    kwargs = {"name": "retry", "ground_truth": "12"}
    state = AgentState(prompt_ids=[1, 2], interaction_kwargs=kwargs)
    for answer in ("13", "12"):
        loop.request("r", state)
        ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        loop.on_turn(state, GenResult("r", [1, 2], ids, [-0.5] * len(ids), "stop"))
        loop.on_user_reply(state, *asyncio.run(users.respond("r", state)))
    assert (state.finish_reason, state.turn_scores) == ("stop", [0.0, 1.0])
    assert AgentState.from_json(state.to_json()).turn_scores == [0.0, 1.0]  # a sync's log

    prompt = PromptRecord("p", "07+05=", "12", extra_info='{"index": 3}')
    record = Record("r.prompts", 0, 0, "p", 0, {}, prompt)
    trajectory = InFlight(record, [1, 2], 0, 0.0).trajectory(0, state, 0.0)
    assert trajectory.turn_scores == [0.0, 1.0]
    reward = _Recording()
    TrajectoryScorer(reward, tok, worker_id=0)(prompt, state, "r")
    assert reward.calls[0].turn_scores == [0.0, 1.0]


def test_a_score_that_is_not_a_number_is_an_interaction_error():
    class Scoring(RetryInteraction):
        async def generate_response(self, instance_id, messages, **kwargs):
            return True, "ok", kwargs["score"], {}

    users = ConfiguredInteractions({"s": Scoring({"name": "s"})})
    state = AgentState(prompt_ids=[1], interaction_kwargs={"score": None})
    assert asyncio.run(users.respond("a", state)) == (True, "ok", None)  # verl keeps none
    state.interaction_kwargs = {"score": "high"}
    with pytest.raises(InteractionError, match="score 'high': a finite number or None"):
        asyncio.run(users.respond("b", state))


def test_without_an_interaction_a_state_keeps_no_prompt_messages():
    """The calculator demo's partials log what they logged before."""
    tok = build_tokenizer(CHARS + calc.TOOL_CHARS)
    parser = CompactParser(CalculatorTool())
    model = build_model(ModelConfig(hidden_size=16, intermediate_size=32), len(tok), seed=0)
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    info = {"interaction_kwargs": {"name": "retry", "ground_truth": "12"}}
    with ToolExecutor({}) as executor:
        plain = AgentRunner(AgentLoop(tok, parser, AgentLimits()), engine, executor)
        assert plain.start_state([1, 2], "07+05=", info) == AgentState(prompt_ids=[1, 2])
        users = ConfiguredInteractions(load_interactions(SHIPPED))
        talking = AgentRunner(AgentLoop(tok, parser, AgentLimits(), users), engine, executor)
        state = talking.start_state([1, 2], "07+05=", info)
    assert state.prompt_messages == [{"role": "user", "content": "07+05="}]
    assert state.interaction_kwargs == info["interaction_kwargs"]
    assert AgentState.from_json(state.to_json()) == state  # logged to partials, read back
