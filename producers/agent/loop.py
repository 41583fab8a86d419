"""The multi-turn agent loop as an interruptible state machine (verl's agent loop, stepwise).

Transitions of one trajectory (``AgentState.phase``)::

    PENDING ──> GENERATING ──turn ends with tool calls──> PROCESSING_TOOLS ──results──┐
                   ^  │                                                                │
                   │  ├──turn ends with an answer, an interaction set──> INTERACTING ──┤
                   │  └──answer / limit reached──> TERMINATED                          │
                   └───────────────────────────────────────────────────────────────────┘

Limits (verl's keys): ``max_assistant_turns`` (a turn that reaches it ends the trajectory even
if it called a tool), ``max_user_turns`` (rounds of tool responses and interaction replies, as
verl counts them: the turn after the last ends the trajectory; 0: no limit),
``response_length`` (all response tokens, tool responses included; the last message is cut
to fit).

:class:`AgentLoop` is the transition logic only (no engine, no threads), so it is tested state
by state; ``agent.runner.AgentRunner`` drives many trajectories through it, an engine and the
tools, and says what an interruption keeps of each phase.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from asyncrl.producers.agent.parser import HermesParser, ToolParser
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.engines.base import GenRequest, GenResult
from asyncrl.producers.tools.base import ToolCall, ToolResult

log = logging.getLogger(__name__)


class Interaction(Protocol):
    """A simulated user answering the model's final answer (verl's interaction; async, as a
    user model or an environment would be). The configured ones (verl's config and classes)
    come through ``agent.interaction.ConfiguredInteractions``."""

    async def respond(self, request_id: str, state: AgentState) -> tuple[bool, str, float | None]:
        """``(done, reply, score)`` to the trajectory's last answer: ``reply`` is the user's
        turn, done ends the trajectory after it, ``score`` (None: none) is kept in
        ``turn_scores``. Raising ends the trajectory (``finish_reason``
        ``interaction_error``)."""
        ...

    async def end(self, request_id: str) -> None:
        """The trajectory ended here or left this process (interrupted)."""
        ...


@dataclass(frozen=True)
class AgentLimits:
    max_assistant_turns: int = 5
    max_user_turns: int = 0
    """Rounds of tool responses and interaction replies (verl's count); 0: no limit."""
    response_length: int = 32
    max_tool_response_length: int = 256
    """Characters of one tool response kept: its start, the rest is cut (verl's
    tool_response_truncate_side=left)."""


class AgentLoop:
    """State transitions; ``tokenizer`` turns text into the ids appended with mask 0."""

    def __init__(
        self,
        tokenizer: Any,
        parser: ToolParser,
        limits: AgentLimits,
        interaction: Interaction | None = None,
        greedy: bool = False,
        chat_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.parser = parser
        self.limits = limits
        self.interaction = interaction
        self.greedy = greedy
        self.chat_kwargs = dict(chat_kwargs or {})
        """``data.apply_chat_template_kwargs``: every chat template call of this loop's."""
        self.stop_token_ids = stop_token_ids(tokenizer, parser)
        self.chat_framing = _frames_by_chat_template(tokenizer, parser, self.chat_kwargs)

    # --- generating ----------------------------------------------------------------------------
    def request(self, request_id: str, state: AgentState) -> GenRequest:
        """The engine request that starts or continues the current assistant turn."""
        if state.phase == Phase.PENDING:
            state.phase = Phase.GENERATING
            state.turn_start = len(state.response_ids)
        if state.phase != Phase.GENERATING:
            raise ValueError(f"{request_id}: no turn to generate in phase {state.phase}")
        t = state.turn_start
        return GenRequest(
            request_id=request_id,
            prompt_ids=state.prompt_ids + state.response_ids[:t],
            max_new_tokens=self.limits.response_length - t,
            prefix_ids=state.response_ids[t:],
            prefix_logprobs=state.response_logprobs[t:],
            greedy=self.greedy,
            stop_token_ids=self.stop_token_ids,
        )

    def _take_turn_tokens(self, state: AgentState, result: GenResult) -> None:
        t = state.turn_start
        n = len(result.response_ids)
        state.response_ids[t:] = result.response_ids
        state.response_logprobs[t:] = [float(x) for x in result.response_logprobs]
        state.response_mask[t:] = [1] * n

    def interrupt(self, state: AgentState, aborted: GenResult | None) -> None:
        """Keep what the engine had of the current turn (``aborted``: its abort result)."""
        if state.phase == Phase.GENERATING and aborted is not None:
            self._take_turn_tokens(state, aborted)

    def on_turn(self, state: AgentState, result: GenResult) -> None:
        """An assistant turn ended (EOS, a stop token, or the length limit)."""
        if result.finish_reason == "abort":
            self.interrupt(state, result)
            return
        self._take_turn_tokens(state, result)
        turn_ids = state.response_ids[state.turn_start :]
        text = self.tokenizer.decode(turn_ids, skip_special_tokens=True)
        state.messages.append({"role": "assistant", "content": text})
        state.assistant_turns += 1
        calls = self.parser.parse(text) if result.finish_reason == "stop" else []
        room = len(state.response_ids) < self.limits.response_length
        max_user = self.limits.max_user_turns
        users_left = not max_user or state.user_turns < max_user
        if calls and (state.assistant_turns >= self.limits.max_assistant_turns or not users_left):
            self._terminate(state, "max_turns")
        elif calls:
            state.phase = Phase.PROCESSING_TOOLS
            state.pending_calls = [c.to_dict() for c in calls]
        elif result.finish_reason == "length" or (calls and not room):
            self._terminate(state, "length")
        elif self.interaction is not None and users_left and room:
            state.phase = Phase.INTERACTING
        else:
            self._terminate(state, "stop")

    # --- tools and users -----------------------------------------------------------------------
    def calls(self, state: AgentState) -> list[ToolCall]:
        return [ToolCall.from_dict(c) for c in state.pending_calls]

    def on_tool_results(self, state: AgentState, results: list[ToolResult]) -> None:
        if state.phase != Phase.PROCESSING_TOOLS or len(results) != len(state.pending_calls):
            raise ValueError(f"{len(results)} results for {len(state.pending_calls)} calls")
        state.user_turns += 1  # a round of responses is a user turn, as verl counts it
        state.tool_calls += len(results)
        state.tool_errors += sum(not r.ok for r in results)
        state.tool_seconds += sum(r.seconds for r in results)
        # Cut before it is kept anywhere, as verl does: the messages go into the agent state a
        # sync logs to partials, and a tool's 10 MB answer there outgrew kafka.max_message_bytes.
        cut = self.limits.max_tool_response_length
        shown = [ToolResult(r.text[:cut], r.ok, r.seconds) for r in results]
        added = [{"role": "tool", "content": r.text} for r in shown]
        state.messages += added
        state.pending_calls = []
        self._append_context(state, self._framed(added, self.parser.render(shown)))

    def answer(self, state: AgentState) -> str:
        """The last assistant message: what the interaction (or the reward) reads."""
        turns = [m["content"] for m in state.messages if m["role"] == "assistant"]
        return turns[-1] if turns else ""

    def on_interaction_error(self, state: AgentState) -> None:
        """The interaction failed: the trajectory ends as it stands (the answer is scored),
        marked, rather than the worker stopping (verl's agent loop raises)."""
        if state.phase != Phase.INTERACTING:
            raise ValueError(f"no user turn in phase {state.phase}")
        self._terminate(state, "interaction_error")

    def on_user_reply(
        self, state: AgentState, done: bool, reply: str, score: float | None = None
    ) -> None:
        """The interaction's reply, appended as a user turn (context, mask 0, cut to the room
        left), the last one too: as verl's agent loop appends it before it reads ``done``,
        which then ends the trajectory (``stop``). Its ``score``, if any, goes to
        ``turn_scores`` (verl's), which the sample and the reward function get."""
        if state.phase != Phase.INTERACTING:
            raise ValueError(f"no user turn in phase {state.phase}")
        if score is not None:
            state.turn_scores.append(float(score))
        state.user_turns += 1
        added = [{"role": "user", "content": reply}]
        state.messages += added
        self._append_context(state, self._framed(added, reply))
        if done:
            self._terminate(state, "stop")

    def _framed(self, messages: list[dict[str, str]], raw: str) -> str:
        """The text that follows the model's turn for ``messages`` (tool responses, a user
        reply). With hermes and a chat model's template, what the template writes for them,
        the next assistant header included, as verl's agent loop appends it: for Qwen,
        ``<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>``
        ``assistant\n``; without, the model would read a bare response after its end of turn
        and write the next turn with no header. Otherwise ``raw`` (the parser's rendering)."""
        if not self.chat_framing:
            return raw
        return _chat_template_tail(self.tokenizer, messages, self.chat_kwargs)

    def _append_context(self, state: AgentState, text: str) -> None:
        """Append non-model tokens (mask 0), then the next assistant turn, if room is left."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        room = self.limits.response_length - len(state.response_ids)
        ids = ids[:room]
        state.response_ids += ids
        state.response_mask += [0] * len(ids)
        state.response_logprobs += [0.0] * len(ids)
        if len(state.response_ids) >= self.limits.response_length:
            self._terminate(state, "length")
        else:
            state.phase = Phase.GENERATING
            state.turn_start = len(state.response_ids)

    @staticmethod
    def _terminate(state: AgentState, why: str) -> None:
        state.phase = Phase.TERMINATED
        state.finish_reason = why


def _chat_template_tail(
    tokenizer: Any, messages: list[dict[str, str]], chat_kwargs: dict[str, Any] | None = None
) -> str:
    """``messages`` through the chat template with the generation prompt (and ``chat_kwargs``,
    ``data.apply_chat_template_kwargs``, as verl passes them here too: Qwen3's next assistant
    header follows ``enable_thinking``), less what the template writes before any message (a
    default system prompt; verl's ``[{}]`` probe)."""
    kwargs = chat_kwargs or {}
    whole = str(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
    )
    try:
        before = str(tokenizer.apply_chat_template([{}], tokenize=False, **kwargs))
    except Exception:  # a template that needs a role: it writes nothing before the messages
        before = ""
    return whole[len(before) :] if before and whole.startswith(before) else whole


def _frames_by_chat_template(
    tokenizer: Any, parser: ToolParser, chat_kwargs: dict[str, Any] | None = None
) -> bool:
    """Hermes with a chat model's template (not the built-in model's, which writes the text
    alone), which can write a tool message: a template that fails on one is left out, and
    the responses appended as the parser renders them."""
    from asyncrl.models.policy import TINY_CHAT_TEMPLATE

    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(parser, HermesParser) or not template or template == TINY_CHAT_TEMPLATE:
        return False
    try:
        _chat_template_tail(tokenizer, [{"role": "tool", "content": "1"}], chat_kwargs)
    except Exception as err:
        log.warning(
            "hermes: the chat template cannot write a tool message (%s: %s); tool responses "
            "are appended as <tool_response> blocks without it",
            type(err).__name__,
            err,
        )
        return False
    return True


def stop_token_ids(tokenizer: Any, parser: ToolParser) -> list[int]:
    """The token of each text that ends a tool call in ``parser``'s format; ValueError where
    the tokenizer has no single token for one (the start-up checks ask too)."""
    ids = []
    for text in parser.stop_texts:
        token_id = tokenizer.convert_tokens_to_ids(text)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no single token for {text!r}")
        ids.append(token_id)
    return ids
