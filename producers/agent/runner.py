"""Drives many agent trajectories through one stepwise engine and one tool executor, one decoding
step at a time, so a weight sync can interrupt them between any two steps (the transitions
themselves are ``agent.loop.AgentLoop``'s). What an interruption keeps of each phase
(``AgentState.phase``):

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
from typing import Any

from asyncrl.producers.agent.loop import AgentLoop
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.engines.base import Engine
from asyncrl.producers.tools.base import ToolResult
from asyncrl.producers.tools.registry import ToolExecutor, tool_schemas

log = logging.getLogger(__name__)


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
