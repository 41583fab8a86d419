"""The ``sim`` engine: a latency model of GPU generation, for benchmarking the pipeline.

A fake, on purpose and by name: nothing here runs a model. Everything around it is real (the
broker, the worker's budget and staleness logic, control events, partial-rollout interrupts,
the weight sync into ``model``); only the time a GPU would spend decoding is replaced by its
modelled duration, so that cluster-scale behaviour (long-tail response lengths keeping a sync
waiting) can be measured on one CPU machine in minutes.

The model, per replica (one rollout worker):
- every request draws a target response length from a long-tail distribution: with
  probability ``long_tail_fraction`` it runs to 80-100% of ``max_new_tokens`` (the long
  chains of thought), otherwise its length is exponential with mean
  ``short_mean_fraction x max_new_tokens``. The draw is seeded by the request id, so a
  continued request (partial rollout) stops where the uninterrupted one would have;
- one decoding step gives active sequences one token each. ``scheduling="fcfs"``: a step
  takes ``decode_step_s`` and advances the first ``capacity`` sequences (the rest wait their
  turn, first come first served). ``scheduling="shared"``: a step advances every active
  sequence and takes ``decode_step_s x max(1, active / capacity)`` (continuous batching as in
  vLLM: memory-bound, so flat, up to ``capacity`` sequences; compute-bound, so growing, above).
  Either way a saturated replica makes ``capacity`` tokens per ``decode_step_s``;
- the engine's clock runs on while the worker does host work (publishing, scoring), as a GPU
  engine in its own process does: ``step()`` performs every modelled step that has come due
  since the last one (at least one, waiting for it if need be), up to ``_MAX_CATCH_UP``. Time
  with nothing in flight (a sync, a pause) is not decoding time: the clock starts again when
  work comes back to an empty engine.
Tokens are random ids (never EOS before the target) with a fixed logprob.
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from dataclasses import dataclass

import torch

from asyncrl.config import SimConfig
from asyncrl.producers.engines.base import ActiveRequest, GenRequest, GenResult, StepwiseEngine

SIM_LOGPROB = -1.0
_MAX_CATCH_UP = 8
"""At most this many modelled steps per ``step()`` call (a stalled host cannot bank time)."""


@dataclass
class _SimActive(ActiveRequest):
    target: int = 1
    """The response length this request ends at (see ``target_length``)."""


def target_length(request_id: str, max_new_tokens: int, sim: SimConfig) -> int:
    """The response length this request will have (same for every continuation of it)."""
    rng = random.Random(zlib.crc32(request_id.encode()) ^ sim.seed)
    if rng.random() < sim.long_tail_fraction:
        return max(1, round(max_new_tokens * rng.uniform(0.8, 1.0)))
    mean = max(1.0, sim.short_mean_fraction * max_new_tokens)
    return max(1, min(max_new_tokens, round(rng.expovariate(1.0 / mean))))


class SimEngine(StepwiseEngine):
    """Stepwise, interruptible, continuable; time modelled (see module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        sim: SimConfig,
        vocab_size: int,
        eos_token_id: int,
        first_token_id: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__(model, eos_token_id)
        self.sim = sim
        self._ids = [i for i in range(first_token_id, vocab_size) if i != eos_token_id]
        self._rng = random.Random(seed)
        self._clock = 0.0  # when the last modelled step ended
        self._resumed = True
        """Work arrived in an empty engine: its clock starts again at the next step."""
        self.steps = 0
        self.tokens = 0

    def close(self) -> None:
        """Log how full the modelled batches were."""
        if self.steps:
            logging.getLogger(__name__).info(
                "%d decoding steps, %.1f sequences per step (capacity %d)",
                self.steps,
                self.tokens / self.steps,
                self.sim.capacity,
            )

    def _start(self, req: GenRequest) -> _SimActive:
        if not self._active:  # idle until now (a sync, a pause): that time decoded nothing
            self._resumed = True
        base = super()._start(req)
        target = target_length(req.request_id, req.max_new_tokens, self.sim)
        return _SimActive(base.req, base.ids, base.logprobs, target=target)

    @property
    def full_batch(self) -> int:
        """``capacity``: fcfs decodes at most that many; shared slows down above it."""
        return self.sim.capacity

    def step_s(self) -> float:
        """The modelled duration of the next decoding step (see module doc)."""
        if self.sim.scheduling == "fcfs":
            return self.sim.decode_step_s
        return self.sim.decode_step_s * max(1.0, len(self._active) / self.sim.capacity)

    def step(self) -> list[GenResult]:
        finished = self._take_complete()
        if not self._active:
            return finished
        now = time.monotonic()
        if self._resumed or now - self._clock > _MAX_CATCH_UP * self.step_s():
            self._clock = now - self.step_s()  # idle or stalled: no banked time
            self._resumed = False
        for done in range(_MAX_CATCH_UP):
            step_s = self.step_s()
            if self._clock + step_s > now:
                if done:
                    break
                time.sleep(self._clock + step_s - now)
            self._clock += step_s
            finished.extend(self.decode_step())
            if not self._active:
                break
        return finished

    def decode_step(self) -> list[GenResult]:
        """One modelled decoding step, without its wait: the first ``capacity`` active
        sequences (``fcfs``) or all of them (``shared``) get a token."""
        finished = []
        self.steps += 1
        active = list(self._active.values())
        for a in active[: self.sim.capacity] if self.sim.scheduling == "fcfs" else active:
            assert isinstance(a, _SimActive)
            last = len(a.ids) + 1 >= a.target
            token = self.eos_token_id if last else self._rng.choice(self._ids)
            self.tokens += 1
            result = self._append(a, token, SIM_LOGPROB)
            if result is not None:
                finished.append(result)
        return finished
