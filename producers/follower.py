"""The rollout worker's half of the sync hand-shake: it follows the trainer's weight versions
(docs/design.md, "A sync, as events on control").

It acts on what its base, ``control_inbox.ControlInbox``, has read on control (a sync
requested, budget refunded or granted, a restarted trainer, the run finished): it joins the
trainer's weight transport, receives each version's weights in place, and publishes the
worker's events of the hand-shake: RolloutPaused, WeightsLoaded, RolloutResumed with the
version's budget. What happens at a sync to the samples in flight (finish, or interrupt and
continue) is the worker's (``worker.py``); the trainer's side of the hand-shake is
``consumers.coordinator``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from asyncrl.config import RunConfig
from asyncrl.producers.budget import RolloutBudget
from asyncrl.producers.control_inbox import ControlInbox
from asyncrl.producers.engines.base import Engine
from asyncrl.schemas import control as ev
from asyncrl.sync.channel import ControlChannel
from asyncrl.sync.checksum import weights_checksum
from asyncrl.sync.results import ManifestMismatchError
from asyncrl.sync.transport import WeightSink
from asyncrl.telemetry.metrics import LevelClock, WaitClock

log = logging.getLogger(__name__)


class TrainerGone(RuntimeError):
    """The trainer this worker joined is gone; a restarted one must be joined."""


class JoinCancelled(RuntimeError):
    """The worker was stopped (SIGTERM, Ctrl-C) while it waited to join a trainer."""


class SyncFollower(ControlInbox):
    def __init__(
        self,
        cfg: RunConfig,
        worker_id: int,
        incarnation: str,
        control: ControlChannel,
        make_sink: Callable[[torch.device], WeightSink],
        engine: Engine,
    ) -> None:
        rollout = cfg.actor_rollout_ref.rollout
        budget = RolloutBudget(cfg.max_samples_per_version, max(1, rollout.num_workers), worker_id)
        super().__init__(worker_id, incarnation, control, budget)
        self.cfg = cfg
        self.make_sink = make_sink
        self.engine = engine
        self.model = engine.model
        """The engine's model: weights are received into it in place (``engine.update_weights``)."""
        self.num_workers = rollout.num_workers
        self.opened = False
        """A budget has been opened: the engine's figures cover a window of work from here."""
        self.sink: WeightSink | None = None
        self.idle = WaitClock()
        """Idle time (nothing to generate) per sync window: rollouter/idle_ratio."""
        self.budget_idle = WaitClock()
        """Of it, the time with the version's budget spent: rollouter/budget_idle_ratio."""
        self.occupancy = LevelClock()
        """How full the engine is (its share of a full batch): rollouter/engine_occupancy."""
        self.budget_unfilled = LevelClock()
        """The engine's empty share while the budget is spent: rollouter/budget_unfilled_ratio."""
        self.keep_alive: Callable[[], None] = lambda: None
        """Polls the prompts group while the worker waits here (or it would lose its partitions)."""
        self.cancelled: Callable[[], bool] = lambda: False
        """The worker has been told to stop: a wait to join a trainer ends (JoinCancelled)."""

    # --- the hand-shake ------------------------------------------------------------------------
    def join(self) -> ev.WeightsPublished:
        """Announce this incarnation, form its pair with the trainer and receive its current
        weights; the WeightsPublished that follows says the version and what it consumed."""
        self.sink = self.make_sink(next(self.model.parameters()).device)
        self.sink.join(
            self.worker_id, self.incarnation, announce=self._announce, waiting=self._waiting
        )
        welcome = self.receive()
        self.joined = True
        return welcome

    def _announce(self) -> None:
        """WorkerStarted, repeated while the trainer has not accepted this worker (or, with
        no trainer up yet, while its store does not answer); a stopped worker stops here."""
        self._waiting()
        self.control.publish(
            ev.WorkerStarted(run_id=self.cfg.run_id, version=self.version, worker=self.worker_id)
        )

    def _waiting(self) -> None:
        """Between two announcements: a stopped worker stops; the prompts group is polled."""
        if self.cancelled():
            raise JoinCancelled("stopped while waiting to join the trainer")
        self.keep_alive()

    def paused(
        self,
        request: ev.SyncRequested,
        n_partial: int,
        produced: int,
        finished: int,
        pause_s: float | None = None,
        flush: bool = True,
    ) -> None:
        """Step 2's end: nothing of the old version is generating any more. ``finished``: the
        samples in flight only being scored, published after the transfer. ``pause_s``: how
        long generation stopped (default: since SyncRequested arrived)."""
        self.control.publish(
            ev.RolloutPaused(
                run_id=self.cfg.run_id,
                version=request.version,
                worker=self.worker_id,
                pause_s=time.monotonic() - self.sync_seen_at if pause_s is None else pause_s,
                in_flight_finished=finished,
                n_partial=n_partial,
                produced=produced,
            ),
            flush=flush,
        )

    def receive(self, version: int | None = None) -> ev.WeightsPublished:
        """Step 3: weights in place, checksum compared, version taken over, WeightsLoaded.

        The trainer publishes WeightsPublished after the transfer, naming the incarnations it
        reached, so it is read afterwards; at a join (``version`` None) it also tells which
        version the trainer is at and how many of this worker's samples it has consumed.
        """
        assert self.sink is not None
        t0 = time.monotonic()
        try:
            sink, bucket_bytes = self.sink, self.cfg.sync.bucket_bytes
            # Here, not in the engine's thread that receives: polling the prompts may hand
            # back samples in flight, which reaches into the engine.
            sink.await_transfer(self.keep_alive)
            self.engine.update_weights(lambda model: sink.receive_into(model, bucket_bytes))
        except ManifestMismatchError:
            raise
        except RuntimeError as err:  # the pair failed: the trainer died mid-transfer
            raise TrainerGone(f"the weight transfer failed ({err})") from err
        before: list[ev.ControlEvent] = []

        def ours(e: ev.ControlEvent) -> bool:
            hit = (
                isinstance(e, ev.WeightsPublished)
                and (version is None or e.version == version)
                and self.incarnation in e.incarnations
            ) or (
                # During a sync, a trainer restarted after the transfer never publishes it. (At
                # a join, the new pair's transfer fails instead if this trainer died since.)
                version is not None and self._new_trainer(e)
            )
            if not hit:
                before.append(e)
            return hit

        published = self.control.wait_for(ev.ControlEvent, idle=self.keep_alive, where=ours)
        if version is None:  # a join: what the welcome's ``consumed`` counts refunds nothing
            self.counted_at_join = [e for e in before if isinstance(e, ev.SamplesDropped)]
        if not isinstance(published, ev.WeightsPublished):
            self.trainer_back = True
            raise TrainerGone(f"a new trainer started (version {published.version})")
        verify = self.cfg.sync.verify_checksum
        checksum = weights_checksum(self.model, like=published.checksum) if verify else ""
        self._loaded(published, checksum, time.monotonic() - t0)
        return published

    def _loaded(
        self, published: ev.WeightsPublished, checksum: str, load_s: float, flush: bool = True
    ) -> None:
        """The weights of ``published`` are in: compare ``checksum`` (if verified), take the
        version over, publish WeightsLoaded."""
        ok = not self.cfg.sync.verify_checksum or checksum == published.checksum
        if not ok:
            log.error(
                "worker %d: weights of version %d differ from the trainer's",
                self.worker_id,
                published.version,
            )
        self.version = published.version
        loaded = ev.WeightsLoaded(
            run_id=self.cfg.run_id,
            version=self.version,
            worker=self.worker_id,
            load_s=load_s,
            checksum_ok=ok,
        )
        self.control.publish(loaded, flush=flush)

    def resume(self, stale: int, published: ev.WeightsPublished, flush: bool = True) -> None:
        """Step 5: open this version's budget (the members' share, minus ``stale``). The
        engine's figures of the window before this process's first budget (its start-up,
        nothing admitted) are not measured (-1): they would read as an empty engine."""
        allowed = self.budget.reset(self.version, stale, self._members(published))
        self.budget.refund(self.refund_at.pop(self.version, 0))  # logged after its request
        for version in [v for v in self.refund_at if v < self.version]:
            del self.refund_at[version]
        occupancy, unfilled = (
            self.occupancy.close_window()[0],
            self.budget_unfilled.close_window()[0],
        )
        if not self.opened:
            occupancy = unfilled = -1.0
            self.opened = True
        self.control.publish(
            ev.RolloutResumed(
                run_id=self.cfg.run_id,
                version=self.version,
                worker=self.worker_id,
                budget=allowed,
                num_stale=stale,
                idle_ratio=self.idle.close_window()[0],
                budget_idle_ratio=self.budget_idle.close_window()[0],
                engine_occupancy=occupancy,
                budget_unfilled_ratio=unfilled,
            ),
            flush=flush,
        )
        log.info(
            "worker %d: version %d, budget %d (stale %d)",
            self.worker_id,
            self.version,
            allowed,
            stale,
        )

    def _members(self, published: ev.WeightsPublished) -> list[int] | None:
        """Who shares the budget of ``published.version``: the members named at its sync, or
        (none named: opened at start-up) the configured workers. A worker added beyond those
        that joins before any sync names it waits for the next one; then it is a member."""
        if published.members:
            return published.members
        return [] if self.worker_id >= self.num_workers else None

    # --- the in-flight update (async_training.in_flight_update) ---------------------------------
    def swapped(
        self,
        request: ev.SyncRequested,
        published: ev.WeightsPublished,
        checksum: str,
        pause_s: float,
        receive_s: float,
        produced: int,
        finished: int,
    ) -> None:
        """The new version is live: RolloutPaused (its pause is the swap's) and WeightsLoaded
        (checksum compared), not flushed, so the decoding loop does not wait for the broker."""
        self.paused(request, 0, produced, finished, pause_s=pause_s, flush=False)
        self._loaded(published, checksum, receive_s, flush=False)
        self.sync_done()

    # --- a restarted trainer -------------------------------------------------------------------
    def rejoin(self) -> ev.WeightsPublished | None:
        """Wait for the restarted trainer, join it and receive its weights (None: the run
        finished first). The old trainer's pending sync is superseded by the new weights."""
        self.idle.set_waiting(True)
        while True:
            if self.sink is not None:  # the pair with the trainer that is gone
                self.sink.close()
                self.sink = None
            self._await_new_trainer()
            if self.finished:
                return None
            try:
                welcome = self.join()
                break
            except (TrainerGone, ConnectionError) as gone:  # that trainer died as we joined
                log.warning("worker %d: %s; waiting for the next trainer", self.worker_id, gone)
                self.trainer_gone, self.trainer_back = str(gone), False
        self.trainer_gone, self.trainer_back = None, False
        self.requests.clear()
        self.published.clear()
        self.refund_at.clear()
        return welcome

    def _await_new_trainer(self) -> None:
        """Until a restarted trainer announces itself (TrainerResumed) or the run finishes;
        its collective is up once it has announced."""
        deadline = time.monotonic() + self.cfg.sync.timeout_s
        while not self.trainer_back and not self.finished:
            for event in self.control.poll(0.2):
                if self._new_trainer(event):
                    self.trainer_back = True
                elif isinstance(event, ev.RunFinished):
                    self.finished = True
                else:
                    self._check_displaced(event)
            self.keep_alive()
            if self.cancelled():
                raise JoinCancelled("stopped while waiting for a restarted trainer")
            if time.monotonic() > deadline:
                raise TrainerGone(
                    f"{self.trainer_gone}, and no trainer started again within "
                    f"sync.timeout_s={self.cfg.sync.timeout_s:.0f} s"
                )

    def left(self, reason: str, produced: int, dropped: list[str]) -> None:
        """The worker leaves the run: ``dropped`` samples (taken, not finished when the run
        finished) are a logged drop, so every prompt taken is a sample or a drop on the log;
        WorkerStopped says why it left."""
        run_id, version, worker = self.cfg.run_id, self.version, self.worker_id
        if dropped:
            reason_dropped = "run finished before the sample did"
            self.control.publish(
                ev.SamplesDropped(
                    run_id=run_id,
                    version=version,
                    worker=worker,
                    target_worker=worker,
                    count=len(dropped),
                    reason=reason_dropped,
                    sample_ids=dropped,
                )
            )
        self.control.publish(
            ev.WorkerStopped(
                run_id=run_id, version=version, worker=worker, reason=reason, produced=produced
            )
        )

    def close(self) -> None:
        self.control.close()
        if self.sink is not None:
            self.sink.close()
