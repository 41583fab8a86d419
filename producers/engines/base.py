"""The inference-engine contract: requests in, results out, exact logprobs.

A rollout worker drives an engine through request-level calls, the ones verl, slime and
prime-rl make of vLLM and SGLang (docs/design.md maps each onto them): ``add`` a request,
``collect`` finished results, ``abort`` some or all (an aborted request returns its tokens and
logprobs so far), ``update_weights`` between two decoding steps, ``num_active``. At a sync the
worker aborts what is in flight, loads the new weights and (with partial rollout) re-adds each
aborted request with ``prefix_ids``/``prefix_logprobs`` set to what it had so far, to continue
under the new weights.

The engines here are stepwise (``StepwiseEngine``: one token for every active request per
``step()``); the worker runs one on a thread of its own (``background.BackgroundEngine``), so
it reacts to control events while the engine decodes, or, with
``actor_rollout_ref.rollout.engine_thread=false``, steps it itself: ``collect`` is then one
decoding step.

Length convention: ``max_new_tokens`` caps the whole *response*, prefix included, so a continued
request stops exactly where the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, runtime_checkable

import torch

FinishReason = Literal["stop", "length", "abort"]
T = TypeVar("T")


@dataclass
class GenRequest:
    """One sequence to generate. ``prefix_ids`` continues an aborted response (see module doc)."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    prefix_ids: list[int] = field(default_factory=list)
    prefix_logprobs: list[float] = field(default_factory=list)
    greedy: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    """Besides EOS, tokens that end the request (finish_reason "stop"): an agent's tool call."""

    def __post_init__(self) -> None:
        if len(self.prefix_ids) != len(self.prefix_logprobs):
            raise ValueError(
                f"{self.request_id}: {len(self.prefix_ids)} prefix ids but "
                f"{len(self.prefix_logprobs)} prefix logprobs"
            )
        if not self.prompt_ids:
            raise ValueError(f"{self.request_id}: empty prompt")


@dataclass
class GenResult:
    """A finished (or aborted) request. ``response_ids``/``response_logprobs`` include the prefix.

    ``response_logprobs[i]`` is log pi(response_ids[i] | prompt, response_ids[:i]) under the
    temperature-scaled distribution the token was sampled from (for greedy requests: under the
    same temperature-scaled distribution, argmax taken). With ``finish_reason == "stop"`` the
    last id is EOS.
    """

    request_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    finish_reason: FinishReason


@runtime_checkable
class Engine(Protocol):
    """What a rollout worker needs from an inference engine (see the module doc)."""

    model: torch.nn.Module
    """The live torch module; weights change only through ``update_weights``."""

    @property
    def num_active(self) -> int:
        """Requests added whose results have not been collected (or aborted) yet."""
        ...

    @property
    def full_batch(self) -> int | None:
        """How many requests decode at once at the engine's full throughput (vLLM's
        ``max_num_seqs``); None: no fixed number (a rollout worker then measures how full the
        engine is against what it may admit itself: ``rollouter/engine_occupancy``)."""
        ...

    def add(self, req: GenRequest) -> None:
        """Queue ``req``; it is generated from the next decoding step on."""
        ...

    def collect(self, timeout: float = 0.0) -> list[GenResult]:
        """Results finished since the last call (and forgotten by the engine); waits up to
        ``timeout`` for the first. A stepwise engine driven inline runs one decoding step."""
        ...

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenResult]:
        """Stop the named requests (default: all; unknown ids are ignored) between two
        decoding steps, returning what each had so far (finish_reason 'abort'). One whose
        tokens already end it comes back with its own reason, not 'abort': one that had
        finished but was not collected yet, or one whose last token is EOS or a stop token,
        or that holds ``max_new_tokens``: it is finished, and continuing it would generate
        past its end."""
        ...

    def update_weights(self, apply: Callable[[torch.nn.Module], T]) -> T:
        """Run ``apply(model)`` (receive or copy new weights into it in place) between two
        decoding steps, and drop whatever the engine derived from the old weights."""
        ...

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Add ``reqs``, wait until all are done; results in the order of ``reqs``."""
        ...

    def prepare(self, rows: int, length: int) -> None:
        """Before the first request: make room for ``rows`` requests at once of up to
        ``length`` tokens each (prompt and response), so that what the engine allocates or
        captures per batch shape is done now, not under the first requests. A hint: more or
        longer requests still work."""
        ...

    def close(self) -> None:
        """Release the engine (its thread, if it has one)."""
        ...


def generate_all(engine: Engine, reqs: list[GenRequest]) -> list[GenResult]:
    """Reference ``generate``: add all, step until none is active, return in request order.

    Requests that were already active in the engine are stepped too and their results dropped,
    so call it on an idle engine.
    """
    for req in reqs:
        engine.add(req)
    done: dict[str, GenResult] = {}
    while engine.num_active:
        for res in engine.collect(timeout=1.0):
            done[res.request_id] = res
    return [done[req.request_id] for req in reqs]


@dataclass
class ActiveRequest:
    """A request being generated: the tokens and logprobs so far (prefix included)."""

    req: GenRequest
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class StepwiseEngine:
    """The bookkeeping every stepwise engine shares: active requests, finish rules, abort.

    A subclass implements ``step()`` (what one decoding step costs and which token comes
    next) and calls :meth:`_take_complete` first and :meth:`_append` per new token.
    """

    def __init__(self, model: torch.nn.Module, eos_token_id: int | Sequence[int]) -> None:
        self.model = model
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.eos_token_id = ids[0]
        self.eos_token_ids = frozenset(ids)
        """Every token that ends a response (``asyncrl.models.policy.eos_token_ids``)."""
        self._active: dict[str, ActiveRequest] = {}

    @property
    def num_active(self) -> int:
        return len(self._active)

    @property
    def full_batch(self) -> int | None:
        return None

    def add(self, req: GenRequest) -> None:
        if req.request_id in self._active:
            raise ValueError(f"request {req.request_id!r} is already active")
        self._active[req.request_id] = self._start(req)

    def _start(self, req: GenRequest) -> ActiveRequest:
        return ActiveRequest(req, list(req.prefix_ids), [float(x) for x in req.prefix_logprobs])

    def _result(self, a: ActiveRequest, reason: FinishReason) -> GenResult:
        return GenResult(a.req.request_id, list(a.req.prompt_ids), a.ids, a.logprobs, reason)

    def _finish_reason(self, a: ActiveRequest) -> FinishReason | None:
        if a.ids and (a.ids[-1] in self.eos_token_ids or a.ids[-1] in a.req.stop_token_ids):
            return "stop"
        if len(a.ids) >= a.req.max_new_tokens:
            return "length"
        return None

    def _take_complete(self) -> list[GenResult]:
        """Drop and return continuations that are already complete (prefix ends in EOS or
        fills the budget), before a step would add a token to them."""
        finished = []
        for rid, a in list(self._active.items()):
            reason = self._finish_reason(a)
            if reason is not None:
                finished.append(self._result(a, reason))
                del self._active[rid]
        return finished

    def _append(self, a: ActiveRequest, token: int, logprob: float) -> GenResult | None:
        """Give ``a`` its next token; if that finishes it, drop it and return its result."""
        a.ids.append(token)
        a.logprobs.append(logprob)
        reason = self._finish_reason(a)
        if reason is None:
            return None
        del self._active[a.req.request_id]
        return self._result(a, reason)

    def active_ids(self) -> list[str]:
        return list(self._active)

    def collect(self, timeout: float = 0.0) -> list[GenResult]:
        """Driven inline: one decoding step (none if nothing is active)."""
        return self.step() if self._active else []

    def step(self) -> list[GenResult]:
        """Advance every active request by one token; return (and drop) those that finished."""
        raise NotImplementedError

    def abort_all(self) -> list[GenResult]:
        return self.abort()

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenResult]:
        out = []
        for rid in self.active_ids() if request_ids is None else request_ids:
            a = self._active.pop(rid, None)
            if a is not None:  # a continuation added already complete is finished, not cut
                out.append(self._result(a, self._finish_reason(a) or "abort"))
        return out

    def update_weights(self, apply: Callable[[torch.nn.Module], T]) -> T:
        with torch.no_grad():
            out = apply(self.model)
        self.weights_changed()
        return out

    def weights_changed(self) -> None:
        """``model``'s weights were replaced in place (``update_weights`` calls it): drop
        anything computed with the old ones, so the next tokens are scored under the new
        weights alone. Nothing here; an engine with a KV cache drops it."""

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        return generate_all(self, reqs)

    def prepare(self, rows: int, length: int) -> None:
        """Nothing to prepare here (``Engine.prepare``); hf_static reserves its slots."""

    def close(self) -> None:
        pass
