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
by state. :class:`AgentRunner` drives many trajectories through a stepwise engine and a tool
executor, one decoding step at a time, and can be interrupted between any two steps:

- GENERATING: the engine's tokens so far are kept in the state; resuming continues the turn
  from them as a prefix (with greedy decoding, the same tokens as without the interruption).
- PROCESSING_TOOLS: the tool calls in flight are abandoned and **run again on resume** (their
  results were never part of the state). Tools must therefore be idempotent, as the shipped
  calculator is: the re-run gives the same response.
- INTERACTING: the interaction's reply is abandoned and asked for again on resume (the same
  rule as tools); the interaction is finalized here and started again where it resumes.
- PENDING: nothing was started; resuming starts it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from asyncrl.producers.agent.parser import HermesParser, ToolParser
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.engines.base import Engine, GenRequest, GenResult
from asyncrl.producers.tools.base import ToolCall, ToolResult
from asyncrl.producers.tools.registry import ToolExecutor, tool_schemas

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


class AgentRunner:
    """Many trajectories through one engine and one tool executor, a decoding step at a time.

    ``wait_for_tools`` (default off) makes every :meth:`step` block, after its decoding step,
    until each tool call and user reply then pending has come back, and take them in the
    order they were started. Off, a step takes only the results that have already arrived, so
    other trajectories keep decoding while a tool runs (a rollout worker's throughput); but
    then *when* a result lands (wall-clock) decides which decoding step its trajectory rejoins,
    hence which sequences share each batch and which draws of the engine's one sampling
    generator each of them gets: sampled trajectories, and their accuracy, change from run to
    run. On, a trajectory rejoins the batch at the step after the one that started its call,
    whatever the call's latency, so a run is a function of the weights, the engine's seed and
    the requests (held-out evaluation, the colocated baseline). A call's wait is bounded by its
    tool's timeout (``Tool.call``).
    """

    def __init__(
        self,
        loop: AgentLoop,
        engine: Engine,
        executor: ToolExecutor,
        wait_for_tools: bool = False,
    ) -> None:
        self.loop = loop
        self.engine = engine
        self.executor = executor
        self.wait_for_tools = wait_for_tools
        self.states: dict[str, AgentState] = {}
        self._tools: dict[str, Future[list[ToolResult]]] = {}
        self._users: dict[str, Future[tuple[bool, str, float | None]]] = {}
        self._done: list[tuple[str, AgentState]] = []
        self._failures: dict[str, int] = {}
        """Interaction failures by message, each logged once with its count so far."""
        self._ending: list[Future[None]] = []
        """Interactions being finalized (``close`` lets them finish)."""

    @property
    def busy(self) -> bool:
        return bool(self.states)

    def start_state(
        self,
        prompt_ids: list[int],
        prompt: str | list[dict[str, Any]],
        extra_info: dict[str, Any] | None = None,
    ) -> AgentState:
        """A new trajectory of ``prompt`` (``prompt_ids``: :meth:`prompt_ids`); with an
        interaction, the state also keeps what it is called with: the prompt as messages and
        the sample's ``extra_info.interaction_kwargs`` (verl's)."""
        state = AgentState(prompt_ids=list(prompt_ids))
        if self.loop.interaction is not None:
            chat = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            state.prompt_messages = [dict(m) for m in chat]
            state.interaction_kwargs = dict((extra_info or {}).get("interaction_kwargs") or {})
        return state

    def prompt_ids(self, prompt: str | list[dict[str, Any]], max_length: int) -> list[int]:
        """A prompt's ids as a trajectory of this runner starts from them: chat messages
        through the chat template with the schemas of the tools this runner calls (verl's
        ``tools=``), plain text as it is; the last ``max_length`` kept (verl's
        ``truncation=left``). Rollout workers and the held-out evaluation both encode here, so
        the ids a worker records are those an evaluation generates from."""
        from asyncrl.models.policy import encode_prompt

        tools = tool_schemas(self.executor.tools)
        return encode_prompt(self.loop.tokenizer, prompt, tools, self.loop.chat_kwargs)[
            -max_length:
        ]

    def add(self, request_id: str, state: AgentState) -> None:
        """Start or resume ``state`` from its phase (see the module doc)."""
        if request_id in self.states:
            raise ValueError(f"{request_id} is already running")
        self.states[request_id] = state
        self._dispatch(request_id, state)

    def _dispatch(self, rid: str, state: AgentState) -> None:
        """Start what the state's phase waits for."""
        if state.phase in (Phase.PENDING, Phase.GENERATING):
            self.engine.add(self.loop.request(rid, state))
        elif state.phase == Phase.PROCESSING_TOOLS:
            self._tools[rid] = self.executor.submit(self.loop.calls(state))
        elif state.phase == Phase.INTERACTING:
            if self.loop.interaction is None:
                raise ValueError(f"{rid}: waits for a user reply but no interaction is set")
            respond = self.loop.interaction.respond(rid, state)
            self._users[rid] = self.executor.submit_coroutine(respond)
        else:
            self._done.append((rid, self.states.pop(rid)))
            self._end_interaction(rid)

    def _end_interaction(self, rid: str) -> None:
        if self.loop.interaction is not None:
            self._ending = [f for f in self._ending if not f.done()]
            self._ending.append(self.executor.submit_coroutine(self.loop.interaction.end(rid)))

    def _user_failed(self, rid: str, err: BaseException) -> None:
        """Log an interaction's failure (once per message, with how often it happened) and end
        the trajectory with finish_reason interaction_error."""
        why = f"{type(err).__name__}: {err}"
        count = self._failures[why] = self._failures.get(why, 0) + 1
        if count == 1:
            log.warning(
                "interaction failed for %s (%s): the trajectory ends with finish_reason "
                "interaction_error; further failures with this message are not logged",
                rid,
                why,
            )
        self.loop.on_interaction_error(self.states[rid])

    def step(self, timeout: float = 0.0) -> list[tuple[str, AgentState]]:
        """The engine's finished turns (an inline engine: one decoding step; one on its own
        thread: what finished, waiting up to ``timeout`` for one), then the tool results and
        user replies that arrived (with ``wait_for_tools``: all of them, waited for); returns
        trajectories that ended."""
        if self.engine.num_active:
            for result in self.engine.collect(timeout):
                state = self.states[result.request_id]
                self.loop.on_turn(state, result)
                self._dispatch(result.request_id, state)
        # Snapshots taken here, after the engine step: with wait_for_tools, the calls this very
        # step started are waited for too (a fast tool would otherwise race the next poll).
        for rid, future in list(self._tools.items()):
            if self.wait_for_tools or future.done():
                results = future.result()
                del self._tools[rid]
                self.loop.on_tool_results(self.states[rid], results)
                self._dispatch(rid, self.states[rid])
        for rid, reply in list(self._users.items()):
            if self.wait_for_tools or reply.done():
                del self._users[rid]
                try:
                    answer = reply.result()
                except Exception as err:  # the interaction's failure ends its trajectory only
                    self._user_failed(rid, err)
                else:
                    self.loop.on_user_reply(self.states[rid], *answer)
                self._dispatch(rid, self.states[rid])
        return self.take_finished()

    def interrupt(self, request_ids: set[str] | None = None) -> dict[str, AgentState]:
        """Stop ``request_ids`` (default: all) between two steps; returns the states of those
        cut short, which ``add`` resumes (here or in another process, through ``to_json``).

        A turn the abort found ended (its last token EOS or a stop token, or the length
        limit; the engine says so by its finish reason) is taken as ended, not cut: the
        trajectory moves on from it (a tool call's results are then asked for on resume),
        and one that it terminated is not returned but finished, under the weights that
        generated it: ``take_finished`` (or the next ``step``) returns it. So every
        trajectory named is either finished or returned here."""
        ids = set(self.states) if request_ids is None else request_ids & set(self.states)
        for result in self.engine.abort(ids):
            state = self.states[result.request_id]
            if result.finish_reason == "abort":
                self.loop.interrupt(state, result)
            else:
                self.loop.on_turn(state, result)
        for pending in (self._tools, self._users):
            for rid in ids & set(pending):
                pending.pop(rid).cancel()  # asked again on resume (see the module doc)
        cut = {}
        for rid in ids:
            self._end_interaction(rid)  # started again where it resumes
            state = self.states.pop(rid)
            if state.phase == Phase.TERMINATED:
                self._done.append((rid, state))
            else:
                cut[rid] = state
        return cut

    def take_finished(self) -> list[tuple[str, AgentState]]:
        """Trajectories that ended since the last ``step`` (as an ``interrupt`` landed)."""
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Stop everything running and the tool executor's thread."""
        self.interrupt()
        for ending in self._ending:  # an interaction's clean-up, before its loop stops
            with contextlib.suppress(Exception):
                ending.result(timeout=5)
        self.executor.close()

    def run(
        self, request_id: str, state: AgentState, idle: Callable[[], None] | None = None
    ) -> AgentState:
        """Drive one trajectory to the end (tests, evaluation)."""
        self.add(request_id, state)
        while True:
            for rid, done in self.step():
                if rid == request_id:
                    return done
            if not self.engine.num_active:
                (idle or (lambda: time.sleep(0.001)))()


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
