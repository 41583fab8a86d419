"""The agent loop: its transitions, the token layout of a multi-turn sample, and interrupting
it in every state (greedy, a real tiny model that learned to call the calculator)."""

import asyncio
import json
import logging
import random
import time
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch

from asyncrl.config import ModelConfig
from asyncrl.models.tiny import CHARS, build_model, build_tokenizer
from asyncrl.models.warm_start import encode_turns, warm_start_turns
from asyncrl.producers.agent.interaction import ConfiguredInteractions, Interaction
from asyncrl.producers.agent.loop import AgentLimits, AgentLoop
from asyncrl.producers.agent.parser import CompactParser, HermesParser, make_parser
from asyncrl.producers.agent.runner import AgentRunner
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.engines.base import GenResult
from asyncrl.producers.engines.hf import HFEngine
from asyncrl.producers.tools.base import ToolCall, ToolResult
from asyncrl.producers.tools.calculator import CalculatorTool
from asyncrl.producers.tools.registry import ToolExecutor
from asyncrl.tasks import calculator as calc


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CHARS + calc.TOOL_CHARS)


def _loop(tok, interaction=None, greedy=True, **limits) -> AgentLoop:
    parser = CompactParser(CalculatorTool())
    return AgentLoop(tok, parser, AgentLimits(**limits), interaction=interaction, greedy=greedy)


def _turn(tok, rid: str, text: str, reason: str = "stop", eos: bool = False) -> GenResult:
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    logprobs = [-0.1 * (i + 1) for i in range(len(ids))]
    return GenResult(rid, [1], ids, logprobs, reason)


# --- transitions --------------------------------------------------------------------------------
def test_a_tool_call_then_an_answer_walks_the_states_in_order(tok):
    loop = _loop(tok)
    state = AgentState(prompt_ids=tok("347*86=")["input_ids"])
    assert state.phase == Phase.PENDING
    req = loop.request("r", state)
    assert state.phase == Phase.GENERATING and req.prefix_ids == []
    assert req.stop_token_ids == [tok.convert_tokens_to_ids("]")]
    loop.on_turn(state, _turn(tok, "r", "[347*86]"))
    assert state.phase == Phase.PROCESSING_TOOLS
    assert loop.calls(state) == [ToolCall("calculator", {"expression": "347*86"})]
    loop.on_tool_results(state, [ToolResult("29842", True, 0.05)])
    assert state.phase == Phase.GENERATING and state.turn_start == 8 + 7
    req = loop.request("r", state)
    assert req.prompt_ids == state.prompt_ids + state.response_ids  # the context so far
    loop.on_turn(state, _turn(tok, "r", "29842", eos=True))
    assert state.phase == Phase.TERMINATED and state.finish_reason == "stop"
    assert (state.assistant_turns, state.tool_calls, state.tool_errors) == (2, 1, 0)
    assert state.num_turns == 3 and state.tool_seconds == pytest.approx(0.05)
    assert calc.score("29842", state.messages) == 1.0


def test_limits_end_the_trajectory(tok):
    # max_assistant_turns: a turn that reaches it ends the trajectory, even with a call.
    state = AgentState(prompt_ids=[1, 5])
    loop = _loop(tok, max_assistant_turns=1)
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[1+1]"))
    assert (state.phase, state.finish_reason) == (Phase.TERMINATED, "max_turns")
    # response_length: the tool response is cut to fit, then the trajectory ends.
    state = AgentState(prompt_ids=[1, 5])
    loop = _loop(tok, response_length=8)
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[99*99]"))
    loop.on_tool_results(state, [ToolResult("9801", True)])
    assert (state.phase, state.finish_reason) == (Phase.TERMINATED, "length")
    assert len(state.response_ids) == 8 and state.response_mask == [1] * 7 + [0]
    # max_tool_response_length: a long response is cut (characters, as verl counts them).
    state = AgentState(prompt_ids=[1, 5])
    loop = _loop(tok, max_tool_response_length=3)
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[9**30]"))
    loop.on_tool_results(state, [ToolResult(str(9**30), True)])
    tail = state.response_ids[state.response_mask.index(0) :]
    assert tok.decode(tail) == "=423 " and state.phase == Phase.GENERATING
    assert state.messages[-1]["content"] == str(9**30)[:3]  # the record keeps what it read


def test_a_huge_tool_response_is_cut_in_the_agent_state_a_sync_logs(tok):
    """A tool that answered 10 MB kept all of it in the state's messages: the partial record a
    sync logs (agent_state JSON) then outgrew kafka.max_message_bytes (8 MiB)."""
    state = AgentState(prompt_ids=[1, 5])
    loop = _loop(tok, max_tool_response_length=8)
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[9*9]"))
    loop.on_tool_results(state, [ToolResult("81 " + "9" * 10_000_000, True)])
    assert state.messages[-1] == {"role": "tool", "content": "81 99999"}
    assert len(state.to_json()) < 2_000


def test_a_failed_tool_call_is_answered_and_the_rollout_goes_on(tok):
    loop = _loop(tok)
    state = AgentState(prompt_ids=[1, 5])
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[1/0]"))
    loop.on_tool_results(state, [ToolResult("error: ZeroDivisionError", False)])
    assert state.phase == Phase.GENERATING and state.tool_errors == 1
    tail = state.response_ids[state.response_mask.index(0) :]
    assert tok.decode(tail) == "=? "  # the demo vocabulary's error mark
    assert state.messages[-1] == {"role": "tool", "content": "error: ZeroDivisionError"}


class _Retry:
    """A user who asks once for the answer again, then is done."""

    async def respond(self, request_id, state):
        await asyncio.sleep(0.02)
        return any(m["role"] == "user" for m in state.messages), "?", None

    async def end(self, request_id):
        pass


def test_an_interaction_adds_user_turns_up_to_max_user_turns(tok):
    loop = _loop(tok, interaction=_Retry(), max_user_turns=1)
    state = AgentState(prompt_ids=[1, 5])
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "12", eos=True))
    assert state.phase == Phase.INTERACTING and loop.answer(state) == "12"
    loop.on_user_reply(state, False, "?")
    assert state.phase == Phase.GENERATING and state.user_turns == 1
    loop.on_turn(state, _turn(tok, "r", "13", eos=True))
    assert state.phase == Phase.TERMINATED  # max_user_turns reached: no more interaction
    assert [m["role"] for m in state.messages] == ["assistant", "user", "assistant"]


@pytest.mark.parametrize(("length", "kept"), [(32, "42"), (4, "4")])
def test_the_reply_that_ends_a_trajectory_is_appended_as_context_as_verl_does(tok, length, kept):
    """verl's agent loop appends the interaction's reply (mask 0) before it reads
    should_terminate; asyncrl dropped the last one. Cut to the room left, it still ends the
    trajectory as the interaction said (stop)."""
    loop = _loop(tok, interaction=_Retry(), response_length=length)
    state = AgentState(prompt_ids=[1, 5])
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "12", eos=True))
    answer = len(state.response_ids)
    loop.on_user_reply(state, True, "42")
    assert (state.phase, state.finish_reason) == (Phase.TERMINATED, "stop")
    assert state.messages[-1] == {"role": "user", "content": "42"}
    assert state.user_turns == 1 and state.num_turns == 2  # verl counts it as a user turn
    assert tok.decode(state.response_ids[answer:]) == kept
    assert state.response_mask[answer:] == [0] * len(kept)
    assert state.response_logprobs[answer:] == [0.0] * len(kept)


def test_max_user_turns_counts_tool_response_rounds_as_verl_does(tok):
    """verl counts each round of tool responses as a user turn, and the turn after the last
    ends the trajectory, tool call or not; asyncrl counted interaction replies only, so a verl
    config's max_user_turns=1 let a model call tools until max_assistant_turns."""
    loop = _loop(tok, max_user_turns=1, max_assistant_turns=5)
    state = AgentState(prompt_ids=[1, 5])
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[2*3]"))
    loop.on_tool_results(state, [ToolResult("6", True)])
    assert state.user_turns == 1 and state.phase == Phase.GENERATING
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[6*7]"))
    assert (state.phase, state.finish_reason) == (Phase.TERMINATED, "max_turns")
    assert state.pending_calls == [] and state.tool_calls == 1
    # 0 is verl's null: no limit (max_assistant_turns still ends it)
    loop = _loop(tok, max_user_turns=0, max_assistant_turns=3)
    state = AgentState(prompt_ids=[1, 5])
    for _ in range(2):
        loop.request("r", state)
        loop.on_turn(state, _turn(tok, "r", "[2*3]"))
        loop.on_tool_results(state, [ToolResult("6", True)])
    assert state.user_turns == 2 and state.phase == Phase.GENERATING


def test_transitions_out_of_order_are_refused(tok):
    loop = _loop(tok)
    state = AgentState(prompt_ids=[1, 5])
    with pytest.raises(ValueError, match="results for 0 calls"):
        loop.on_tool_results(state, [ToolResult("1", True)])
    with pytest.raises(ValueError, match="no user turn"):
        loop.on_user_reply(state, True, "")
    loop.request("r", state)
    loop.on_turn(state, _turn(tok, "r", "[2*2]"))
    with pytest.raises(ValueError, match="no turn to generate"):
        loop.request("r", state)


# --- the token layout ---------------------------------------------------------------------------
def test_mask_and_logprobs_line_up_with_the_tokens_of_each_turn(tok):
    loop = _loop(tok)
    state = AgentState(prompt_ids=tok("347*86=")["input_ids"])
    first, last = _turn(tok, "r", "[347*86]"), _turn(tok, "r", "29842", eos=True)
    loop.request("r", state)
    loop.on_turn(state, first)
    loop.on_tool_results(state, [ToolResult("29842", True)])
    loop.on_turn(state, last)
    tool_ids = tok("=29842 ", add_special_tokens=False)["input_ids"]
    assert state.response_ids == first.response_ids + tool_ids + last.response_ids
    assert state.response_mask == [1] * 8 + [0] * 7 + [1] * 6
    assert state.response_logprobs == first.response_logprobs + [0.0] * 7 + last.response_logprobs
    assert tok.decode(state.response_ids, skip_special_tokens=True) == "[347*86]=29842 29842"
    # The teacher's trajectory for the warm start has the very same layout.
    _, ids, mask = encode_turns(
        tok,
        calc.make_problem(347, 86),
        calc.teacher_turns(calc.make_problem(347, 86), use_tool=True),
    )
    assert (ids, mask) == (state.response_ids, state.response_mask)
    # And the state survives JSON (what the partials topic carries).
    back = AgentState.from_json(state.to_json())
    assert back == state and json.loads(state.to_json())["phase"] == "terminated"


def test_a_corrupt_state_is_refused():
    bad = AgentState(prompt_ids=[1], response_ids=[5, 6], response_mask=[1], response_logprobs=[0])
    with pytest.raises(ValueError, match="2 ids, 1 mask"):
        AgentState.from_json(bad.to_json())


def test_hermes_calls_parse_with_their_json_arguments():
    parser = make_parser("hermes", {"calculator": CalculatorTool()})
    assert isinstance(parser, HermesParser) and parser.stop_texts == ()
    text = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}'
        '</tool_call><tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"4\\"}"}'
        "</tool_call><tool_call>{not json}</tool_call>"
    )
    calls = parser.parse(text)
    assert calls[0] == ToolCall("calculator", {"expression": "2*3"})
    assert calls[1] == ToolCall("calculator", {"expression": "4"})
    assert calls[2].name == "" and calls[2].error.startswith("malformed tool call")
    assert parser.parse("The answer is 6.") == []
    out = parser.render([ToolResult("6", True)])
    assert out == "\n<tool_response>\n6\n</tool_response>\n"


# --- interrupt and resume, with a real model -----------------------------------------------------
@pytest.fixture(scope="module")
def policy(tok):
    """A tiny model taught to call the calculator (every teacher trajectory uses it)."""

    class Data:
        seed, train_size, val_size = 0, 2000, 50

    train, val = calc.make_splits(Data)
    model = build_model(ModelConfig(hidden_size=64, intermediate_size=128), len(tok), seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same weights whatever ran before (as warm_start.build)
    try:
        warm_start_turns(model, tok, train, calc.teacher_turns, tool_prob=1.0, steps=200)
    finally:
        torch.set_num_threads(threads)
    return model, val


def _runner(tok, model, executor, interaction=None, max_user_turns=0) -> AgentRunner:
    loop = _loop(tok, interaction=interaction, max_user_turns=max_user_turns)
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    return AgentRunner(loop, engine, executor)


STOPS = [  # (phase, which visit of it, tokens into the turn)
    ("pending", 0, 0),  # before the first step
    ("generating", 1, 3),  # 3 tokens into the call
    ("processing_tools", 1, 0),  # the call is with the calculator
    ("generating", 2, 2),  # 2 tokens into the answer
    ("interacting", 1, 0),  # the user is replying
    ("generating", 3, 1),  # 1 token into the turn after the user's reply
]


def _advance(runner: AgentRunner, state: AgentState, phase: Phase, visit: int, tokens: int):
    """Step until ``state`` is in its ``visit``-th stay in ``phase`` (and, generating, the
    engine holds ``tokens`` of the turn)."""
    seen, last = 0, None
    while True:
        if state.phase != last:
            last = state.phase
            seen += state.phase == phase
        if state.phase == phase and seen == visit:
            active = runner.engine._active.get("r")  # the turn's tokens live in the engine
            if phase != Phase.GENERATING or (active is not None and len(active.ids) >= tokens):
                return
        assert runner.step() == [], f"the trajectory ended before {phase} #{visit}"


@pytest.mark.parametrize(("phase", "visit", "tokens"), STOPS)
def test_interrupt_and_resume_in_any_state_gives_the_uninterrupted_trajectory(
    tok, policy, phase, visit, tokens
):
    model, val = policy
    prompt_ids = tok(val[0].prompt)["input_ids"]
    with ToolExecutor({"calculator": CalculatorTool()}) as executor:
        whole = _runner(tok, model, executor, _Retry(), 2).run("r", AgentState(prompt_ids))
        assert calc.used_tool(whole.messages) and whole.user_turns == 2  # every state visited

        runner = _runner(tok, model, executor, _Retry(), 2)
        state = AgentState(prompt_ids)
        if phase != "pending":
            runner.add("r", state)
            _advance(runner, state, Phase(phase), visit, tokens)
            state = runner.interrupt()["r"]
        assert state.phase == Phase(phase) and not runner.busy
        assert runner.engine.num_active == 0
        if phase == "generating":
            assert len(state.response_ids) - state.turn_start == tokens  # kept, not redone
        # Another process picks it up from the log.
        saved = AgentState.from_json(state.to_json())
        resumed = _runner(tok, model, executor, _Retry(), 2).run("r", saved)
    assert resumed.response_ids == whole.response_ids
    assert resumed.response_mask == whole.response_mask
    assert resumed.response_logprobs == pytest.approx(whole.response_logprobs, abs=1e-5)
    assert resumed.messages == whole.messages
    assert (resumed.finish_reason, resumed.assistant_turns, resumed.tool_calls) == (
        whole.finish_reason,
        whole.assistant_turns,
        whole.tool_calls,
    )


def test_the_runner_interrupts_only_the_trajectories_named(tok, policy):
    model, val = policy
    with ToolExecutor({"calculator": CalculatorTool()}) as executor:
        runner = _runner(tok, model, executor)
        for i, p in enumerate(val[:3]):
            runner.add(str(i), AgentState(tok(p.prompt)["input_ids"]))
        runner.step()
        cut = runner.interrupt({"1"})
        assert list(cut) == ["1"] and cut["1"].phase == Phase.GENERATING
        assert len(cut["1"].response_ids) == 1  # its one token so far is kept
        done = {}
        while runner.busy:
            done.update(runner.step())
        assert sorted(done) == ["0", "2"]
        for rid in done:
            assert calc.score(val[int(rid)].answer, done[rid].messages) == 1.0


@pytest.mark.parametrize(
    ("turn", "phase", "cut"),
    [
        ("17", Phase.TERMINATED, False),  # the answer, ended by EOS
        ("[3*4]", Phase.PROCESSING_TOOLS, True),  # a tool call, ended by its stop token
    ],
)
def test_a_turn_the_abort_finds_ended_is_taken_as_ended_not_cut(tok, turn, phase, cut):
    """An interrupt whose abort meets a turn already ended (here a continuation whose tokens
    end in EOS or a stop token, not stepped yet) moves the trajectory on from that turn: an
    answer finishes it (``take_finished``), a tool call waits for its results. Before, both
    came back cut short while generating, to be continued past their end."""
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64), len(tok), seed=0)
    with ToolExecutor({"calculator": CalculatorTool()}) as executor:
        runner = _runner(tok, model, executor)
        ended = _turn(tok, "r", turn, eos=turn == "17")
        state = AgentState(
            prompt_ids=tok("3*4+5=")["input_ids"],
            phase=Phase.GENERATING,
            response_ids=list(ended.response_ids),
            response_mask=[1] * len(ended.response_ids),
            response_logprobs=list(ended.response_logprobs),
        )
        runner.add("r", state)
        interrupted = runner.interrupt()
        finished = runner.step()  # what ended, with no engine step (nothing is active)
    assert state.phase == phase and not runner.busy
    assert list(interrupted) == (["r"] if cut else [])
    assert finished == ([] if cut else [("r", state)])
    assert state.response_ids == ended.response_ids  # nothing generated past the end
    if not cut:
        assert state.finish_reason == "stop"
    else:
        assert runner.loop.calls(state) == [ToolCall("calculator", {"expression": "3*4"})]


def test_greedy_decoding_is_deterministic_here(tok, policy):
    """The premise of the resume tests: two uninterrupted runs agree."""
    model, val = policy
    with ToolExecutor({"calculator": CalculatorTool()}) as executor:
        a = _runner(tok, model, executor).run("r", AgentState(tok(val[1].prompt)["input_ids"]))
        b = _runner(tok, model, executor).run("r", AgentState(tok(val[1].prompt)["input_ids"]))
    assert replace(a, tool_seconds=0.0) == replace(b, tool_seconds=0.0)  # all but timing


# --- waiting for tools: sampled runs that repeat --------------------------------------------------
class _SlowCalculator(CalculatorTool):
    """The calculator, answering after a random 0-20 ms (a loaded sandbox, a remote tool)."""

    async def execute(self, arguments):
        await asyncio.sleep(random.uniform(0.0, 0.02))
        return await super().execute(arguments)


class _SlowRetry(_Retry):
    """``_Retry``, replying after a random 0-20 ms."""

    async def respond(self, request_id, state):
        await asyncio.sleep(random.uniform(0.0, 0.02))
        return any(m["role"] == "user" for m in state.messages), "?", None


class _Late(Future):
    """A result that is already in but says it is not done for its first ``polls`` polls."""

    def __init__(self, result, polls: int) -> None:
        super().__init__()
        self.set_result(result)
        self.polls = polls

    def done(self) -> bool:
        self.polls -= 1
        return self.polls < 0


class _LateExecutor(ToolExecutor):
    """Every call and reply turns up 0-5 polls late, the same pattern for the same seed: the
    arrival order of slow tools, reproducibly."""

    def __init__(self, tools, seed: int) -> None:
        super().__init__(tools)
        self.rng = random.Random(seed)

    def submit(self, calls):
        return _Late(super().submit(calls).result(), self.rng.randrange(6))

    def submit_coroutine(self, coro):
        return _Late(super().submit_coroutine(coro).result(), self.rng.randrange(6))


def _sample(tok, model, prompts, executor, interaction, wait_for_tools: bool) -> dict:
    """Three sampled trajectories per prompt, all in one batch (seed 0), timings left out."""
    loop = _loop(tok, interaction=interaction, greedy=False, max_user_turns=2)
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    runner = AgentRunner(loop, engine, executor, wait_for_tools=wait_for_tools)
    for i, p in enumerate(prompts):
        for j in range(3):
            runner.add(f"{i}/{j}", AgentState(tok(p.prompt)["input_ids"]))
    done = {}
    while runner.busy:
        done.update(runner.step())
        if not engine.num_active:
            time.sleep(0.001)
    return {rid: replace(state, tool_seconds=0.0) for rid, state in done.items()}


def test_waiting_for_tools_makes_sampled_runs_repeat_whatever_the_tools_latency(tok, policy):
    model, val = policy
    runs = []
    for _ in range(2):
        with ToolExecutor({"calculator": _SlowCalculator()}) as executor:
            runs.append(_sample(tok, model, val[:8], executor, _SlowRetry(), True))
    assert len(runs[0]) == 24 and sum(s.tool_calls for s in runs[0].values()) > 0
    assert sum(s.user_turns for s in runs[0].values()) > 0
    assert len({tuple(s.response_ids) for s in runs[0].values()}) > 8  # sampled, not one per prompt
    assert runs[0] == runs[1]
    # Results that arrive some polls late, in a seeded pattern: waiting, the same trajectories
    # again; polling, the pattern decides which sequences share a step and draw, so they differ.
    late = {}
    for wait in (True, False):
        for seed in (1, 2):
            with _LateExecutor({"calculator": CalculatorTool()}, seed) as executor:
                late[wait, seed] = _sample(tok, model, val[:8], executor, _Retry(), wait)
    assert late[True, 1] == late[True, 2] == runs[0]
    assert late[False, 1] != late[False, 2]


TWO_CALLS = (  # a hermes turn asking the calculator twice
    '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2**10"}}</tool_call>'
)


def _printable_tokenizer():
    """A wide character vocabulary standing in for a chat model's tokenizer."""
    import string

    return build_tokenizer("".join(c for c in string.printable if c not in "\t\r\x0b\x0c"))


def test_a_hermes_turn_runs_its_calls_and_appends_the_responses_as_context():
    """The chat-model format end to end through the loop and the real calculator (a wide
    character vocabulary stands in for a chat tokenizer)."""
    tok = _printable_tokenizer()
    loop = AgentLoop(tok, HermesParser(), AgentLimits(response_length=400))
    state = AgentState(prompt_ids=tok("What is 6*7 and 2**10?")["input_ids"])
    loop.request("r", state)
    turn = TWO_CALLS
    loop.on_turn(state, _turn(tok, "r", turn, eos=True))
    assert state.phase == Phase.PROCESSING_TOOLS and len(state.pending_calls) == 2
    with ToolExecutor({"calculator": CalculatorTool()}) as executor:
        loop.on_tool_results(state, executor.run(loop.calls(state)))
    rendered = (
        "\n<tool_response>\n42\n</tool_response>\n\n<tool_response>\n1024\n</tool_response>\n"
    )
    appended = state.response_ids[state.response_mask.index(0) :]
    assert appended == tok(rendered, add_special_tokens=False)["input_ids"]
    assert [m["content"] for m in state.messages[1:]] == ["42", "1024"]
    assert state.phase == Phase.GENERATING and state.tool_calls == 2
    loop.on_turn(state, _turn(tok, "r", "42 and 1024.", eos=True))
    assert state.phase == Phase.TERMINATED and loop.answer(state) == "42 and 1024."


QWENISH = (  # the shape of Qwen2.5's template: a default system prompt, tools as a user turn
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{%- if m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif m['role'] %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_hermes_with_a_chat_template_frames_responses_as_the_template_does():
    """With a chat model, tool responses were appended as bare <tool_response> blocks right
    after the model's end of turn, with no user turn around them and no assistant header for
    the next turn: not the layout the model was tuned on, nor verl's (the chat template's)."""
    tok = _printable_tokenizer()
    tok.chat_template = QWENISH
    loop = AgentLoop(tok, HermesParser(), AgentLimits(response_length=600), interaction=_Retry())
    state = AgentState(prompt_ids=tok("What is 6*7 and 2**10?")["input_ids"])
    loop.request("r", state)
    turn = TWO_CALLS
    loop.on_turn(state, _turn(tok, "r", turn, eos=True))
    loop.on_tool_results(state, [ToolResult("42", True), ToolResult("1024", True)])
    appended = tok.decode(state.response_ids[state.response_mask.index(0) :])
    assert appended == (
        "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n1024\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    start = len(state.response_ids)
    loop.on_turn(state, _turn(tok, "r", "42 and 1024.", eos=True))
    assert state.phase == Phase.INTERACTING
    loop.on_user_reply(state, False, "Sure?")
    tail = state.response_ids[start:]
    reply = tok.decode(
        [t for t, m in zip(tail, state.response_mask[start:], strict=True) if m == 0]
    )
    assert reply == "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    assert [m["content"] for m in state.messages if m["role"] == "tool"] == ["42", "1024"]


# --- a configured interaction (verl's BaseInteraction) that fails mid-run ------------------------
class _Recorder(Interaction):
    """Replies "again" once, then is done; fails for a trajectory whose kwargs say so; records
    what it is called with."""

    calls: list = []

    async def start_interaction(self, instance_id=None, **kwargs):
        self.calls.append(("start", instance_id, kwargs))
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.calls.append(("reply", instance_id, [m["role"] for m in messages]))
        if kwargs.get("fail"):
            raise ConnectionError("user model unreachable")
        return any(m["role"] == "user" for m in messages[1:]), "again", 0.0, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        self.calls.append(("finalize", instance_id))


def test_a_failing_interaction_ends_its_trajectory_not_the_worker(tok, policy, caplog):
    """An interaction that raised stopped the runner's step (the worker) with its exception;
    verl's loop raises too. Now that trajectory ends as it stood (finish_reason
    interaction_error, logged once), and the others go on."""
    model, val = policy
    _Recorder.calls = []
    users = ConfiguredInteractions({"user": _Recorder({"name": "user"})})
    loop = AgentLoop(tok, CompactParser(CalculatorTool()), AgentLimits(response_length=64), users)
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    executor = ToolExecutor({"calculator": CalculatorTool()})
    runner = AgentRunner(loop, engine, executor, wait_for_tools=True)
    try:
        for rid, fail, p in zip(("ok", "bad1", "bad2"), (False, True, True), val, strict=False):
            info = {"interaction_kwargs": {"name": "user", "fail": fail}}
            runner.add(rid, runner.start_state(tok(p.prompt)["input_ids"], p.prompt, info))
        with caplog.at_level(logging.WARNING):
            done = {}
            while runner.busy:
                done.update(runner.step())
    finally:
        runner.close()
    assert {rid: s.finish_reason for rid, s in done.items()} == {
        "ok": "stop",
        "bad1": "interaction_error",
        "bad2": "interaction_error",
    }
    assert "user" in [m["role"] for m in done["ok"].messages]
    bad = done["bad1"]
    assert bad.phase == Phase.TERMINATED and bad.messages[-1]["role"] == "assistant"
    assert 0 not in bad.response_mask[bad.turn_start :]  # it ends with the model's answer
    warnings = [r.getMessage() for r in caplog.records if "interaction failed" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionError: user model unreachable" in warnings[0]
    ok = [c for c in _Recorder.calls if c[1] == "ok"]
    assert ok[0] == ("start", "ok", {"name": "user", "fail": False})
    # verl's messages: the prompt's, then the conversation (a call, its response, an answer)
    assert ok[1] == ("reply", "ok", ["user", "assistant", "tool", "assistant"])
    assert ok[2][2][:6] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert {c[1] for c in _Recorder.calls if c[0] == "finalize"} == {"ok", "bad1", "bad2"}
