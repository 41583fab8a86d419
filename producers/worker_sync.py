"""A sync on a rollout worker's side: steps 2-5 of ``producers.worker``'s module docstring
(pause, receive, continue, resume), the restarted trainer's join, and the in-flight update's
swap (``async_training.in_flight_update``), as methods ``RolloutWorker`` inherits."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asyncrl.producers.budget import num_stale_at_sync
from asyncrl.producers.follower import TrainerGone
from asyncrl.producers.shadow_weights import ShadowWeights
from asyncrl.producers.spans import sync_span
from asyncrl.schemas import control as ev
from asyncrl.sync.checksum import same_format, weights_checksum

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.producers.admission import PromptAdmission
    from asyncrl.producers.agent.runner import AgentRunner
    from asyncrl.producers.completion import Completion
    from asyncrl.producers.engines.base import Engine
    from asyncrl.producers.follower import SyncFollower
    from asyncrl.producers.in_flight import InFlight, InFlightSamples
    from asyncrl.producers.scoring import TrajectoryScorer
    from asyncrl.producers.validation import RolloutValidator

__all__ = ["WorkerSync"]

log = logging.getLogger(__name__)


class WorkerSync:
    """The sync steps of ``RolloutWorker`` (the attributes below are the worker's)."""

    cfg: RunConfig
    worker_id: int
    partial_rollout: bool
    follower: SyncFollower
    engine: Engine
    runner: AgentRunner
    score: TrajectoryScorer
    in_flight: InFlightSamples
    done: Completion
    admission: PromptAdmission
    validator: RolloutValidator
    shadow: ShadowWeights | None
    filters: object

    @property
    def version(self) -> int:
        return self.follower.version

    def _gauge(self, syncing: bool = False) -> None: ...

    # --- a sync, steps 2-5 of the module docstring ----------------------------------------------
    def _sync(self, request: ev.SyncRequested) -> None:
        f = self.follower
        attrs = {"asyncrl.version": request.version, "asyncrl.worker": self.worker_id}
        with sync_span("sync.pause", request.headers, f.sync_seen_ns, **attrs):
            if self.partial_rollout:  # 2.
                n_partial = self._interrupt(hold_scored=True)
            else:  # (c): all finished decoding
                n_partial = 0
                self.done.drain(only=self._scored_before_pause)
            self._gauge(syncing=True)  # nothing decodes until the new weights are in
            f.paused(request, n_partial, self.done.produced, self.in_flight.num_finished())
        with sync_span("weights.load", request.headers, **attrs):
            try:
                published = f.receive(request.version)  # 3.
            except TrainerGone as gone:
                f.trainer_gone = str(gone)
                self._rejoin()
                return
        self.in_flight.continue_all(f.version)  # 4.
        self._open_budget(published, consumed=request.consumed)  # 5.
        f.sync_done()

    def _rejoin(self) -> None:
        """Join the restarted trainer (see the module docstring): in mode (d) in-flight work
        was interrupted and logged first; in mode (c) it has finished."""
        log.warning(
            "worker %d: %s; joining the new trainer's weight collective",
            self.worker_id,
            self.follower.trainer_gone,
        )
        if self.partial_rollout and (self.runner.busy or self.score.pending):
            self._interrupt()
        else:  # mode (c): all finished decoding; published before the new trainer's weights
            self.done.drain()
        if self.shadow is not None:
            self.shadow.close()
            self.shadow = None
        welcome = self.follower.rejoin()
        if welcome is None:  # the run finished first
            return
        self.in_flight.continue_all(self.follower.version)
        self._open_budget(welcome)
        self._start_shadow()

    # --- the in-flight update (async_training.in_flight_update) ---------------------------------
    def _start_shadow(self) -> None:
        """After a join: receive the next versions in the background (``shadow_weights``)."""
        self.shadow = ShadowWeights.after_join(self.cfg, self.follower.sink, self.engine.model)

    def _swap(self, request: ev.SyncRequested, published: ev.WeightsPublished) -> None:
        """A sync without a pause: nothing is logged to partials, nothing waits for the broker.

        Its ``weights.load`` span (the swap, checksum, RolloutPaused and WeightsLoaded) joins
        the trainer's sync trace, as mode (c)'s and (d)'s do."""
        assert self.shadow is not None
        attrs = {"asyncrl.version": request.version, "asyncrl.worker": self.worker_id}
        with sync_span("weights.load", request.headers, **attrs):
            checksum, pause_s = self.shadow.swap(self.engine, self.in_flight, published.version)
            if checksum and published.checksum and not same_format(checksum, published.checksum):
                # Hashed ahead in another format than the trainer chose (its first sync, or a
                # trainer restarted on another kind of device): again in the trainer's.
                checksum = weights_checksum(self.engine.model, like=published.checksum)
            self.shadow.like = published.checksum or None
            receive_s = self.shadow.receive_s
            finished = self.in_flight.num_finished()  # published after the swap
            self.follower.swapped(
                request, published, checksum, pause_s, receive_s, self.done.produced, finished
            )
        self._open_budget(published, consumed=request.consumed, flush=False)

    def _open_budget(
        self,
        published: ev.WeightsPublished,
        consumed: dict[str, int] | None = None,
        flush: bool = True,
    ) -> None:
        """This version's budget, minus this worker's stale samples: produced and not consumed
        by the trainer (``consumed``, or at a join the WeightsPublished's), in flight, or
        logged partials of its previous incarnation. Groups dynamic sampling leaves out count
        on neither side: their slots came back as they were published."""
        consumed = published.consumed if consumed is None else consumed
        stale = num_stale_at_sync(
            self.done.produced - self.done.no_signal,
            consumed.get(str(self.worker_id), 0),
            in_flight=len(self.in_flight),
            partial=self.admission.num_stale_partials(),
        )
        self.follower.resume(stale, published, flush=flush)
        self.validator.after_load(published, self.engine)

    def _interrupt(self, hold_scored: bool = False) -> int:
        """Mode (d): cut every in-flight trajectory short, wait for the finished ones' scores
        (a sample they complete is published whole) and log each other sample to ``partials``
        with its finished trajectories and their rewards (acknowledged before the worker
        pauses); returns the number of samples logged. ``hold_scored`` (a sync): wait only
        for the scores of the samples logged (and those held over from the last sync), not
        for those of samples with every trajectory finished: they are published after."""
        self.in_flight.interrupt()
        self.done.drain(only=self._scored_before_pause if hold_scored else None)
        return self.in_flight.log_partials(list(self.in_flight), self.worker_id, self.version)

    def _scored_before_pause(self, fl: InFlight) -> bool:
        """Must a sync's pause wait for this sample's pending scores? Yes if a trajectory of it
        was cut short (it is logged to ``partials`` with its finished trajectories' rewards).
        With dynamic sampling, also if it was being scored at the last sync already (a backlog
        outliving a whole version): a group with no signal takes its slot back under the
        version it is published at, which must be the one its last trajectory finished under
        or the next, as ``asyncrl audit`` allows. Otherwise the version a sample is published
        at changes nothing: it counts in flight (stale) at every sync until then."""
        held_over = self.filters is not None and fl.finished_under < self.version
        return bool(fl.interrupted) or held_over
