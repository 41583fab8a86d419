"""The agent loop's tool schemas reach a chat prompt's template, as verl passes them
(``apply_chat_template(messages, tools=..., add_generation_prompt=True)``), in every place a
prompt is encoded: the rollout worker's admission, the held-out evaluation (both through
``AgentRunner.prompt_ids``) and the data's length filter (``producers.agent.data.load_split``)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import asyncrl
from asyncrl.config import ConfigError, load_config
from asyncrl.models.policy import TINY_CHAT_TEMPLATE, encode_prompt, load_tokenizer
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.producers.admission import PromptAdmission
from asyncrl.producers.agent.factory import make_runner
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.budget import RolloutBudget
from asyncrl.producers.engines.hf import HFEngine
from asyncrl.producers.in_flight import InFlightSamples
from asyncrl.producers.tools.registry import load_tools, prompt_tool_schemas, shipped_tools_path
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.prompt import TAG, PromptRecord
from asyncrl.schemas.prompt import encode_prompt as encode_record
from asyncrl.tasks.files import load_split
from asyncrl.testing import MemoryBroker, MemoryPromptSource
from tests.helpers import SMALL

TOOLS_TEMPLATE = (  # the shape of Qwen2.5's: the tools' schemas in a system turn
    "{%- if tools %}{{- '<|system|>Tools:' }}{%- for t in tools %}"
    "{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>' + m['content'] + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)
MESSAGES = [{"role": "user", "content": "What is 347*86?"}]


def _chat_tokenizer():
    tok = build_tokenizer("".join(c for c in string.printable if c not in "\t\r\x0b\x0c"))
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def _calculator_schema() -> dict:
    return load_tools(shipped_tools_path())["calculator"].tool_schema


def test_a_template_that_renders_tools_gets_their_schemas_and_one_that_ignores_them_not():
    tok = _chat_tokenizer()
    schema = _calculator_schema()
    text = tok.decode(encode_prompt(tok, MESSAGES, [schema]))
    assert text == f"<|system|>Tools:\n{json.dumps(schema)}\n<|user|>What is 347*86?\n<|assistant|>"
    assert tok.decode(encode_prompt(tok, MESSAGES)) == "<|user|>What is 347*86?\n<|assistant|>"
    # The built-in model's template ignores them: the calculator demo's ids stay the same.
    tiny = build_tokenizer()
    tiny.chat_template = TINY_CHAT_TEMPLATE
    plain = [{"role": "user", "content": "07+35="}]
    assert encode_prompt(tiny, plain, [schema]) == encode_prompt(tiny, plain)


@pytest.mark.parametrize("interaction", [False, True])
def test_the_worker_the_evaluation_and_the_length_filter_encode_a_chat_prompt_alike(
    tmp_path, interaction
):
    """verl writes the tool schemas into the prompt; the worker encoded a chat prompt without
    them, so a chat model never read which tools it had. With an interaction, the worker's
    trajectories also carry what it is called with (the sample's interaction_kwargs)."""
    shipped = Path(asyncrl.__file__).parent / "configs" / "interactions" / "retry.yaml"
    users = [f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={shipped}"]
    cfg = load_config(
        "calculator",
        overrides=[
            *SMALL,
            f"output_dir={tmp_path}",
            "data.max_prompt_length=600",
            *(users if interaction else []),
        ],
    )
    tok = _chat_tokenizer()
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=0)
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    runner = make_runner(cfg, tok, engine)
    broker = MemoryBroker()
    try:
        kwargs = {"name": "retry", "ground_truth": "29842"}
        record = PromptRecord(
            "chat-0",
            "",
            "29842",
            messages=json.dumps(MESSAGES),
            extra_info=json.dumps({"interaction_kwargs": kwargs}),
        )
        broker.append(
            cfg.topic("prompts"), "chat-0", encode_record(record), {SCHEMA_HEADER: TAG.encode()}
        )
        prompts = MemoryPromptSource(cfg, broker, lambda _: None, lambda _p, _l: None)
        in_flight = InFlightSamples(runner, broker.publisher(), cfg.topic, n=1)
        admission = PromptAdmission(cfg, 0, in_flight, tok, broker.scan(cfg))
        budget = RolloutBudget(max_per_version=1)
        budget.reset(version=0, num_stale=0)
        assert admission.admit(prompts, budget, version=0)
        (started,) = runner.states.values()
    finally:
        runner.close()
    expected = encode_prompt(tok, MESSAGES, prompt_tool_schemas(cfg))  # the length filter's
    assert started.prompt_ids == expected
    assert json.dumps(_calculator_schema()) in tok.decode(started.prompt_ids)
    assert runner.prompt_ids(MESSAGES, 600) == expected  # the held-out evaluation's
    assert started.interaction_kwargs == (kwargs if interaction else {})
    assert started.prompt_messages == (MESSAGES if interaction else [])


def test_without_the_agent_loop_no_tools_reach_the_template():
    cfg = load_config()
    assert prompt_tool_schemas(cfg) is None
    tok = load_tokenizer(cfg)
    plain = [{"role": "user", "content": "1+1="}]
    assert encode_prompt(tok, plain, prompt_tool_schemas(cfg)) == tok("1+1=")["input_ids"]


THINKING_TEMPLATE = (  # the shape of Qwen3's: enable_thinking=false writes an empty think block
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>' + m['content'] + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think></think>' }}"
    "{%- endif %}{%- endif %}"
)
NO_THINKING = "data.apply_chat_template_kwargs.enable_thinking=false"


def _thinking_run(tmp_path, *overrides):
    tok = _chat_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    cfg = load_config(
        "calculator",
        overrides=[*SMALL, f"output_dir={tmp_path}", "data.max_prompt_length=600", *overrides],
    )
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=0)
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    return cfg, tok, make_runner(cfg, tok, engine)


def test_apply_chat_template_kwargs_reach_the_prompt_and_the_length_filter(tmp_path):
    """verl passes data.apply_chat_template_kwargs to every apply_chat_template (Qwen3's
    enable_thinking=false); they were ignored, so a run asked not to think prompted for it."""
    path = tmp_path / "chat.parquet"
    row = {"data_source": "calculator", "prompt": MESSAGES}
    pq.write_table(pa.Table.from_pylist([row | {"reward_model": {"ground_truth": "29842"}}]), path)
    files = [f"data.train_files={path}", f"data.val_files={path}"]
    cfg, tok, runner = _thinking_run(tmp_path, NO_THINKING, *files)
    try:
        ids = runner.prompt_ids(MESSAGES, 600)  # the workers' and the evaluation's
    finally:
        runner.close()
    assert tok.decode(ids).endswith("<|assistant|><think></think>")
    cfg.data.max_prompt_length = len(ids)  # the length filter counts the same tokens
    assert load_split(cfg, "train", tok).too_long == 0
    cfg.data.max_prompt_length = len(ids) - 1
    with pytest.raises(ConfigError, match="all 1 prompts are longer"):
        load_split(cfg, "train", tok)


def test_apply_chat_template_kwargs_frame_a_user_reply_as_verl_does(tmp_path):
    """verl applies them to the tool responses and user turns it appends too: the next
    assistant header after a reply is the one the prompt ended with."""
    _, tok, runner = _thinking_run(
        tmp_path,
        NO_THINKING,
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "data.max_response_length=64",
    )
    try:
        state = AgentState(prompt_ids=[], phase=Phase.INTERACTING)
        runner.loop.on_user_reply(state, False, "Try again.")
    finally:
        runner.close()
    assert tok.decode(state.response_ids) == "<|user|>Try again.\n<|assistant|><think></think>"


def test_apply_chat_template_kwargs_cannot_set_what_asyncrl_sets():
    with pytest.raises(ConfigError, match=r"data.apply_chat_template_kwargs: tools: set by"):
        load_config(overrides=["data.apply_chat_template_kwargs.tools=[]"])
    cfg = load_config(overrides=["+data.apply_chat_template_kwargs.enable_thinking=False"])
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}  # verl's spelling
