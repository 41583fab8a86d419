"""A rollout worker process: prompts in, scored samples out, weights from the trainer.

One thread runs everything, so a sync can never race with generation: between two decoding
steps the loop reads control events, admits prompts within the version's budget, advances
every in-flight trajectory by one token, scores trajectories as they finish (reward during
rollout), and publishes each sample as soon as its whole group is done.

A sync, on this side (DESIGN.md section 4):
1. SyncRequested(v+1) arrives: stop admitting prompts.
2. Mode (c): in-flight samples finish and are published. Mode (d, ``partial_rollout``): they
   are interrupted before the next decoding step, and each is published to ``partials`` (its
   finished trajectories and the interrupted ones' tokens so far). Publish RolloutPaused(v+1).
3. Receive the weights over the collective (in place); publish WeightsLoaded(v+1).
4. Mode (d): re-add every interrupted trajectory as a continuation of its prefix, before any
   new prompt; its next tokens form a new segment under v+1.
5. Open the budget of v+1 minus this worker's stale samples (partial ones included); publish
   RolloutResumed(v+1).

The trainer restarts (it died, and ``asyncrl run`` or its operator started it again from its
checkpoint): its pair fails, or its TrainerResumed arrives. The worker stops admitting prompts,
finishes (mode c) or interrupts and logs (mode d) what is in flight, as for a sync, then joins
the new trainer's collective, receives its weights (a version above any on the log), continues
the interrupted trajectories and opens that version's budget. Nothing is lost: the samples it
published while no trainer ran are on the log, and the new trainer reads them.

A (re)start: scan the log (``recovery.RecoveryIndex``), announce WorkerStarted with a fresh
incarnation id, join the weight collective and receive the trainer's current weights. Prompts
the previous incarnation took but did not finish are redelivered by the group: one whose
sample is already on ``samples`` is committed without generating it again, one with a logged
partial is continued from it, any other starts afresh. So every prompt taken ends as exactly
one sample, or (at the end of the run) one logged drop.

Workers come and go (``asyncrl rollout --worker-id N`` with a new N, SIGTERM to one): the
prompts group moves partitions between them. The old owner stops generating the prompts of a
partition before releasing it (mode d: their tokens go to ``partials`` first), flushes, and
commits what is done; the new owner re-reads the log before admitting them, so each becomes
one sample. The budget of a version is split among the members named at its sync
(WeightsPublished.members); a worker added before a sync names it starts at the next one, and
the unfilled share of one that leaves is granted to the others (BudgetGranted).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid

import torch

from asyncrl.config import RunConfig
from asyncrl.kafka import Publisher, Record
from asyncrl.models.policy import encode_prompt
from asyncrl.producers.agent.factory import make_runner
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.budget import RolloutBudget, num_stale_at_sync
from asyncrl.producers.in_flight import InFlight
from asyncrl.producers.prompt_source import PromptSource
from asyncrl.producers.recovery import WORKER_HEADER, RecoveryIndex
from asyncrl.producers.reward import RewardCall, Scored
from asyncrl.producers.spans import sync_span
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import TAG as PARTIAL_TAG
from asyncrl.schemas.partial import PartialSample, encode_partial
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import TAG as SAMPLE_TAG
from asyncrl.schemas.sample import encode_sample
from asyncrl.sync.channel import ControlChannel
from asyncrl.sync.checksum import weights_checksum
from asyncrl.sync.collective import ManifestMismatchError
from asyncrl.sync.transport import WeightSink, make_sink
from asyncrl.telemetry import tracing
from asyncrl.telemetry.metrics import WaitClock

log = logging.getLogger(__name__)


class TrainerGone(RuntimeError):
    """The trainer this worker joined is gone; a restarted one must be joined."""


class RolloutWorker:
    def __init__(self, cfg: RunConfig, worker_id: int, bootstrap: str) -> None:
        from asyncrl.models.warm_start import load_policy
        from asyncrl.producers.engines.factory import make_engine
        from asyncrl.producers.reward import make_reward

        self.cfg = cfg
        self.worker_id = worker_id
        tracing.init_tracing(cfg, f"asyncrl-rollout-{worker_id}")
        self.rollout = cfg.actor_rollout_ref.rollout
        self.partial_rollout = cfg.async_training.mode == "d"
        self.reward = make_reward(cfg)
        """Scores each finished trajectory (the task's rule, or custom_reward_function)."""
        self.reward_failures = 0
        model, self.tokenizer = load_policy(cfg)
        model.eval()
        self.engine = make_engine(
            cfg, model, self.tokenizer, seed=cfg.trainer.seed + 1000 * (worker_id + 1)
        )
        self.runner = make_runner(cfg, self.tokenizer, self.engine)
        """Every trajectory runs as an agent (one turn unless multi_turn.enable)."""
        self.incarnation = uuid.uuid4().hex[:12]
        """This process's lifetime; a restarted worker gets a new one (WorkerStarted says it)."""
        self.publisher = Publisher(cfg.kafka, bootstrap)
        self.dead_letter = (self.publisher, cfg.topic("dead-letter"))
        self.control = ControlChannel.connect(
            cfg, bootstrap, self.publisher, worker=worker_id, incarnation=self.incarnation
        )
        self.budget = RolloutBudget(
            cfg.max_samples_per_version, max(1, self.rollout.num_workers), worker_id
        )
        self.bootstrap = bootstrap
        self.in_flight: dict[str, InFlight] = {}
        self.produced = 0
        self.version = 0
        self.pending_sync: ev.SyncRequested | None = None
        self.trainer_gone: str | None = None
        """Why the trainer this worker joined is gone (a new one must be joined), or None."""
        self.trainer_back = False
        """A new trainer's TrainerResumed has arrived (it hosts the collective by now)."""
        self.stale_partials: set[str] = set()
        """This worker's partial samples, logged by its previous incarnation, not continued yet:
        counted as stale in its budget (num_stale), so continuing one takes no budget."""
        self.prompts: PromptSource | None = None
        """The prompts group's member (from run()); kept polling while the worker waits."""
        self.sync_seen_at = 0.0
        self.sync_seen_ns: int | None = None
        self.finished = False
        self.stopping = False
        """Set by stop() (SIGTERM): leave the run, handing unfinished work back to the log."""
        self.idle = WaitClock()
        """Idle time (nothing to generate) per sync window: rollouter/idle_ratio."""
        self.receiver: WeightSink | None = None
        self.recovery = RecoveryIndex()
        self.rescan = False
        """Set when the prompts group is rebalanced: re-read the log before the next admission."""

    # --- weights --------------------------------------------------------------------------------
    def _join_collective(self) -> None:
        """Announce this incarnation and form its pair with the trainer (see sync.collective)."""
        self.receiver = make_sink(self.cfg, next(self.engine.model.parameters()).device)
        self.receiver.join(
            self.worker_id,
            self.incarnation,
            announce=self._announce,
        )

    def _announce(self) -> None:
        """WorkerStarted, repeated while the trainer has not accepted this worker; the prompts
        group is polled meanwhile, or a long wait would cost the worker its partitions."""
        self.control.publish(
            ev.WorkerStarted(run_id=self.cfg.run_id, version=self.version, worker=self.worker_id)
        )
        if self.prompts is not None:
            self.prompts.keep_alive()

    def _receive_weights(self, version: int | None = None) -> ev.WeightsPublished:
        """Steps 3-4 of a sync: weights in place, checksum compared, version taken over.

        The trainer publishes WeightsPublished after the transfer, naming the incarnations it
        reached, so it is read afterwards; at a join (``version`` None) it also tells which
        version the trainer is at and how many of this worker's samples it has consumed.
        """
        assert self.receiver is not None
        t0 = time.monotonic()
        try:
            self.receiver.receive_into(self.engine.model, self.cfg.sync.bucket_bytes)
        except ManifestMismatchError:
            raise
        except RuntimeError as err:  # the pair failed: the trainer died mid-transfer
            raise TrainerGone(f"the weight transfer failed ({err})") from err
        published = self.control.wait_for(
            ev.ControlEvent,
            where=lambda e: (
                (
                    isinstance(e, ev.WeightsPublished)
                    and (version is None or e.version == version)
                    and self.incarnation in e.incarnations
                )
                # During a sync, a trainer restarted after the transfer never publishes it. (At
                # a join, the new pair's transfer fails instead if this trainer died since.)
                or (version is not None and self._new_trainer(e))
            ),
        )
        if not isinstance(published, ev.WeightsPublished):
            self.trainer_back = True
            raise TrainerGone(f"a new trainer started (version {published.version})")
        ok = True
        if self.cfg.sync.verify_checksum:
            ok = weights_checksum(self.engine.model) == published.checksum
            if not ok:
                log.error(
                    "worker %d: weights of version %d differ from the trainer's",
                    self.worker_id,
                    published.version,
                )
        self.version = published.version
        self.control.publish(
            ev.WeightsLoaded(
                run_id=self.cfg.run_id,
                version=self.version,
                worker=self.worker_id,
                load_s=time.monotonic() - t0,
                checksum_ok=ok,
            )
        )
        return published

    def _new_trainer(self, event: ev.ControlEvent) -> bool:
        """A TrainerResumed of a trainer this worker has not joined: its versions are above
        every version on the log, so above this worker's, unlike the one it joined."""
        return isinstance(event, ev.TrainerResumed) and event.version > self.version

    def _await_new_trainer(self) -> None:
        """Until a restarted trainer announces itself (TrainerResumed) or the run finishes,
        keeping the prompts group alive; its collective is up once it has announced."""
        deadline = time.monotonic() + self.cfg.sync.timeout_s
        while not self.trainer_back and not self.finished:
            for event in self.control.poll(0.2):
                if self._new_trainer(event):
                    self.trainer_back = True
                elif isinstance(event, ev.RunFinished):
                    self.finished = True
            if self.prompts is not None:
                self.prompts.keep_alive()
            if time.monotonic() > deadline:
                raise TrainerGone(
                    f"{self.trainer_gone}, and no trainer started again within "
                    f"sync.timeout_s={self.cfg.sync.timeout_s:.0f} s"
                )

    def _rejoin(self) -> None:
        """Join the restarted trainer (see the module docstring): in mode (d) in-flight work
        was interrupted and logged first; in mode (c) it has finished."""
        log.warning(
            "worker %d: %s; joining the new trainer's weight collective",
            self.worker_id,
            self.trainer_gone,
        )
        if self.partial_rollout and self.runner.busy:
            self._interrupt()
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        self.idle.set_waiting(True)
        self._await_new_trainer()
        if self.finished:
            return
        self._join_collective()
        welcome = self._receive_weights()
        self.trainer_gone, self.trainer_back = None, False
        self.pending_sync = None  # the old trainer's sync: the new trainer's weights supersede it
        self._continue_interrupted()
        self._open_budget(welcome.consumed.get(str(self.worker_id), 0), self._split(welcome))

    def _split(self, published: ev.WeightsPublished) -> list[int] | None:
        """Who shares the budget of ``published.version``: the members named at its sync, or
        (none named: opened at start-up) the configured workers. A worker added beyond those
        that joins before any sync names it waits for the next one; then it is a member."""
        if published.members:
            return published.members
        return [] if self.worker_id >= self.rollout.num_workers else None

    def _open_budget(self, consumed: int, members: list[int] | None = None) -> None:
        self.stale_partials &= set(self.recovery.partials)  # others may have continued some
        stale = num_stale_at_sync(
            self.produced, consumed, in_flight=len(self.in_flight), partial=len(self.stale_partials)
        )
        allowed = self.budget.reset(self.version, stale, members)
        self.control.publish(
            ev.RolloutResumed(
                run_id=self.cfg.run_id,
                version=self.version,
                worker=self.worker_id,
                budget=allowed,
                num_stale=stale,
                idle_ratio=self.idle.close_window()[0],
            )
        )
        log.info(
            "worker %d: version %d, budget %d (stale %d)",
            self.worker_id,
            self.version,
            allowed,
            stale,
        )

    def _do_sync(self, request: ev.SyncRequested) -> None:
        attrs = {"asyncrl.version": request.version, "asyncrl.worker": self.worker_id}
        with sync_span("sync.pause", request.headers, self.sync_seen_ns, **attrs):
            n_partial = self._interrupt() if self.partial_rollout else 0
            self.control.publish(
                ev.RolloutPaused(
                    run_id=self.cfg.run_id,
                    version=request.version,
                    worker=self.worker_id,
                    pause_s=time.monotonic() - self.sync_seen_at,
                    n_partial=n_partial,
                    produced=self.produced,
                )
            )
        with sync_span("weights.load", request.headers, **attrs):
            try:
                published = self._receive_weights(request.version)
            except TrainerGone as gone:
                self.trainer_gone = str(gone)
                self._rejoin()
                return
        self._continue_interrupted()
        self._open_budget(request.consumed.get(str(self.worker_id), 0), self._split(published))
        self.pending_sync = None

    # --- partial rollout (mode d) ------------------------------------------------------------
    def _interrupt(self) -> int:
        """Cut every in-flight trajectory short and log each interrupted sample to ``partials``.

        Returns the number of samples interrupted. The messages are acknowledged before the
        worker pauses, so the log holds every partial trajectory of the sync.
        """
        self._mark_interrupted(self.runner.interrupt())
        return self._log_partials(list(self.in_flight))

    def _mark_interrupted(self, states: dict[str, AgentState]) -> None:
        for request_id, state in states.items():
            sample_id, _, index = request_id.rpartition("#")
            self.in_flight[sample_id].interrupted[int(index)] = state

    def _log_partials(self, sample_ids: list[str]) -> int:
        """Publish each of ``sample_ids`` that has interrupted trajectories to ``partials``
        and wait for the broker's acknowledgement; returns how many were logged."""
        now = time.time()
        topic = self.cfg.topic("partials")
        interrupted = [(sid, self.in_flight[sid]) for sid in sample_ids]
        interrupted = [(sid, fl) for sid, fl in interrupted if fl.interrupted]
        for sample_id, fl in interrupted:
            fl.trace.end_segment(interrupted=True)
            record = fl.partial(sample_id, self.worker_id, self.rollout.n, self.version, now)
            with fl.trace.current():
                self.publisher.publish(
                    topic, sample_id, encode_partial(record), headers={SCHEMA_HEADER: PARTIAL_TAG}
                )
        self.publisher.flush()
        return len(interrupted)

    def _continue_interrupted(self) -> None:
        """Re-add interrupted trajectories, continuing their prefixes under the new version."""
        for sample_id, fl in self.in_flight.items():
            self._continue(sample_id, fl)

    def _continue(self, sample_id: str, fl: InFlight) -> None:
        """Re-add one sample's interrupted trajectories; each starts a segment under self.version."""
        if fl.interrupted:
            fl.trace.start_segment(self.version)
        for i, state in sorted(fl.interrupted.items()):
            starts, versions = fl.segments_of(i)
            if starts[-1] == len(state.response_ids):
                versions[-1] = self.version  # the last segment got no token: it moves
            else:
                starts.append(len(state.response_ids))
                versions.append(self.version)
            self.runner.add(f"{sample_id}#{i}", state)  # resumes from its phase
        fl.interrupted.clear()

    def _resume_logged(self, rec: Record[PromptRecord], partial: PartialSample) -> None:
        """Continue a sample a previous incarnation logged to ``partials`` (crash recovery)."""
        s = partial.sample
        fl = InFlight.from_partial(rec, partial)
        self.in_flight[s.sample_id] = fl
        fl.trace.start(
            rec.topic, s.sample_id, rec.headers, rec.partition, rec.offset, self.version, True
        )
        log.info(
            "worker %d: continuing %s from the partials log (%d of %d trajectories to finish)",
            self.worker_id,
            s.sample_id,
            len(fl.interrupted),
            self.rollout.n,
        )
        self._continue(s.sample_id, fl)

    # --- control events -----------------------------------------------------------------------
    def _handle(self, event: ev.ControlEvent) -> None:
        if self._new_trainer(event):
            self.trainer_gone = f"a new trainer started (version {event.version})"
            self.trainer_back = True
        elif isinstance(event, ev.SyncRequested) and event.version > self.version:
            self.pending_sync = event
            self.sync_seen_at = time.monotonic()
            self.sync_seen_ns = time.time_ns()
        elif self._grants_budget(event):
            assert isinstance(event, (ev.SamplesDropped, ev.BudgetGranted))
            self.budget.refund(event.count)
        elif isinstance(event, ev.RunFinished):
            self.finished = True

    def _grants_budget(self, event: ev.ControlEvent) -> bool:
        """Samples the trainer dropped of ours, or a share of this version handed over to us."""
        if isinstance(event, ev.SamplesDropped):
            return event.target_worker == self.worker_id
        return (
            isinstance(event, ev.BudgetGranted)
            and event.target_worker == self.worker_id
            and event.version == self.version
        )

    # --- prompt partitions moving between workers ----------------------------------------------
    def _on_prompts_assigned(self, partitions: set[int]) -> None:
        """Partitions may come from another worker (even the first ones of a worker added
        mid-run): some of their redelivered prompts may be published or logged as partials
        by it since this worker last read the log. Re-read it before the next admission."""
        self.rescan = True

    def _on_prompts_revoked(self, partitions: set[int], lost: bool) -> None:
        """Partitions move to another worker, which gets their uncommitted prompts again: stop
        generating those, or they would be generated twice.

        Mode (d) logs their partials first (unless the partitions are lost already, when the
        new owner may have started them), so the new owner continues rather than restarts
        them; mode (c) drops their tokens. Either way the budget they took is refunded, and
        the publisher is flushed, so the new owner's log scan sees every sample and partial
        of those partitions before it admits one of their prompts.
        """
        if self.finished or self.stopping:
            return  # run() is ending; its clean-up hands everything back
        moving = [sid for sid, fl in self.in_flight.items() if fl.prompt.partition in partitions]
        if moving:
            ids = {f"{sid}#{i}" for sid in moving for i in range(self.rollout.n)}
            self._mark_interrupted(self.runner.interrupt(ids))
            logged = self._log_partials(moving) if self.partial_rollout and not lost else 0
            for sid in moving:
                self.in_flight.pop(sid).trace.end("its prompt partition moved to another worker")
            self.budget.refund(len(moving))
            log.info(
                "worker %d: handed %d samples in flight back to the group (%d logged as partials)",
                self.worker_id,
                len(moving),
                logged,
            )
        self.publisher.flush()

    # --- generation -----------------------------------------------------------------------------
    def _admit(self, prompts: PromptSource) -> bool:
        """Start one sample if the budget and the concurrency limit allow; True if one started.

        This worker's own logged partials (``stale_partials``) go first, out of order, and take
        no budget: they were counted as stale when the budget was opened."""
        if (
            self.pending_sync is not None
            or self.trainer_gone is not None
            or len(self.in_flight) >= self.rollout.max_concurrent_samples
        ):
            prompts.keep_alive()
            return False
        rec = None
        if self.stale_partials:
            rec = prompts.take_where(lambda r: r.value.sample_id in self.stale_partials)
        if rec is None and self.budget.remaining == 0:
            prompts.keep_alive()
            return False
        if rec is None:
            rec = prompts.take(timeout=0.0 if self.in_flight else 0.05)
        if rec is None:
            return False
        p = rec.value
        if self.rescan:
            self.rescan = False
            self.recovery.rescan(self.cfg, self.bootstrap)
        if self.recovery.already_published(p.sample_id):
            # Redelivered after a crash, but its sample is on the log: only the commit was lost.
            log.info(
                "worker %d: %s already published, not generated again", self.worker_id, p.sample_id
            )
            prompts.done(rec)
            self.stale_partials.discard(p.sample_id)
            return True
        if p.sample_id in self.stale_partials:
            self.stale_partials.discard(p.sample_id)  # counted as stale: no budget taken
        else:
            self.budget.take()
        partial = self.recovery.take_partial(p.sample_id)
        if partial is not None:
            self._resume_logged(rec, partial)
            return True
        # chat messages through the chat template; a built-in task's text: <bos> + characters
        prompt_ids = encode_prompt(self.tokenizer, p.chat() or p.prompt)
        prompt_ids = prompt_ids[-self.cfg.data.max_prompt_length :]  # verl truncation="left"
        fl = self.in_flight[p.sample_id] = InFlight(rec, prompt_ids, self.version, time.time())
        fl.trace.start(rec.topic, p.sample_id, rec.headers, rec.partition, rec.offset, self.version)
        fl.trace.start_segment(self.version)
        for i in range(self.rollout.n):
            self.runner.add(f"{p.sample_id}#{i}", AgentState(prompt_ids=list(prompt_ids)))
        return True

    def _on_finished(self, request_id: str, state: AgentState, prompts: PromptSource) -> None:
        sample_id, _, index = request_id.rpartition("#")
        fl = self.in_flight[sample_id]
        t0 = time.perf_counter()
        with fl.trace.child("reward", **{"asyncrl.traj_index": int(index)}):
            scored = self._score(fl.prompt.value, state)
        if scored.failed:
            self._reward_failed(request_id, scored)
        fl.done[int(index)] = fl.trajectory(
            int(index), state, scored.score, time.time(), time.perf_counter() - t0, scored
        )
        if len(fl.done) == self.rollout.n:
            self._publish(sample_id, fl, prompts)

    def _score(self, prompt: PromptRecord, state: AgentState) -> Scored:
        return self.reward(
            RewardCall(
                data_source=prompt.data_source,
                ground_truth=prompt.reward_ground_truth(),
                extra_info=prompt.reward_extra_info(),
                messages=state.messages,
                solution_str=self.tokenizer.decode(state.response_ids, skip_special_tokens=True),
                num_turns=1 + max(state.num_turns, 1),  # verl counts the prompt
            )
        )

    def _reward_failed(self, request_id: str, scored: Scored) -> None:
        """Logged (the first few in full, then every 100th) and counted; the trajectory is
        published with ``reward_error`` set, and the trainer does not train on it."""
        self.reward_failures += 1
        n = self.reward_failures
        if n <= 5 or n % 100 == 0:
            log.warning(
                "worker %d: reward failure %d, %s: %s (published with reward_error set: "
                "not trained on)",
                self.worker_id,
                n,
                request_id,
                scored.error,
            )

    def _publish(self, sample_id: str, fl: InFlight, prompts: PromptSource) -> None:
        sample = fl.sample(sample_id, self.worker_id, [fl.done[i] for i in range(self.rollout.n)])
        fl.trace.end_segment(tokens=sum(len(t.response_ids) for t in sample.trajectories))
        with fl.trace.current():
            self.publisher.publish(
                self.cfg.topic("samples"),
                sample_id,
                encode_sample(sample),
                headers={SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: str(self.worker_id)},
                # The prompt's offset may be committed only once the broker has the sample. Not
                # flushing here keeps the decode loop from stalling a broker round trip per sample.
                on_acked=functools.partial(prompts.done, fl.prompt),
            )
        fl.trace.end()
        del self.in_flight[sample_id]
        self.produced += 1

    # --- main loop -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Leave the run at the next decoding step (safe to call from a signal handler).

        Prompts in flight are not committed, so the group hands them to another worker (or
        to this worker's successor); in mode (d) their tokens so far are logged to
        ``partials`` first, so the successor continues rather than restarts them.
        """
        self.stopping = True

    def run(self) -> int:
        """Serve until the trainer publishes RunFinished; returns the number of samples produced."""
        self._start()
        prompts = self.prompts = PromptSource(
            self.cfg,
            self.bootstrap,
            dead_letter=self.dead_letter,
            on_assign=self._on_prompts_assigned,
            on_revoke=self._on_prompts_revoked,
        )
        try:
            while not self.finished and not self.stopping:
                self._serve_control(0.0)
                # A sync (or a new trainer) goes first once nothing has to finish before it.
                if self.partial_rollout or not self.in_flight:
                    if self.trainer_gone is not None:
                        self._rejoin()
                        continue
                    if self.pending_sync is not None:
                        self._do_sync(self.pending_sync)
                        continue
                while self._admit(prompts):
                    pass
                self.publisher.poll(0)  # acknowledgements: commit the prompts of acked samples
                self.publisher.check()
                self.idle.set_waiting(not self.runner.busy)
                if self.runner.busy:
                    self._advance(prompts)
                else:
                    prompts.keep_alive()
                    self._serve_control(0.05)
            if self.stopping and self.partial_rollout and self.in_flight:
                self._interrupt()
        finally:
            self._leave(prompts)
        return self.produced

    def _start(self) -> None:
        """Read the log (what a previous incarnation left), join the collective, receive the
        trainer's weights and open this version's budget."""
        self.control.start()
        self.recovery = RecoveryIndex.from_log(self.cfg, self.bootstrap)
        self.produced = self.recovery.produced[self.worker_id]
        if self.recovery.published or self.recovery.partials:
            log.info(
                "worker %d: the log holds %d samples (%d of this worker) and %d unfinished "
                "partial samples",
                *(self.worker_id, len(self.recovery.published), self.produced),
                len(self.recovery.partials),
            )
        self._join_collective()
        welcome = self._receive_weights()
        # What a previous incarnation left on the partials log counts as stale, like work in
        # flight at a sync; continuing it takes no budget (_admit).
        self.stale_partials = {
            sid for sid, p in self.recovery.partials.items() if p.sample.worker_id == self.worker_id
        }
        self._open_budget(welcome.consumed.get(str(self.worker_id), 0), self._split(welcome))

    def _serve_control(self, timeout: float) -> None:
        for event in self.control.poll(timeout):
            self._handle(event)

    def _advance(self, prompts: PromptSource) -> None:
        """One decoding step of every sequence in flight (if any) and the tool results that
        came back; finished trajectories are scored, finished samples published."""
        decoding = self.engine.num_active > 0
        with torch.no_grad():
            for request_id, state in self.runner.step():
                self._on_finished(request_id, state, prompts)
        if not decoding:  # only tool calls (or user replies) under way
            self._serve_control(0.002)

    def _leave(self, prompts: PromptSource) -> None:
        """The run is over for this worker: what is in flight is a logged drop (the run
        finished) or handed back to the group (stopped, or an error); WorkerStopped says why."""
        self.runner.close()
        self.reward.close()
        for fl in self.in_flight.values():
            fl.trace.end("run finished first" if self.finished else "handed back to the log")
        if self.finished and self.in_flight:
            # Accounted for in the log: every prompt taken is a sample or a logged drop.
            self.control.publish(
                ev.SamplesDropped(
                    run_id=self.cfg.run_id,
                    version=self.version,
                    worker=self.worker_id,
                    target_worker=self.worker_id,
                    count=len(self.in_flight),
                    reason="run finished before the sample did",
                    sample_ids=sorted(self.in_flight),
                )
            )
        reason = "run finished" if self.finished else "stopped" if self.stopping else "error"
        self.control.publish(
            ev.WorkerStopped(
                run_id=self.cfg.run_id,
                version=self.version,
                worker=self.worker_id,
                reason=reason,
                produced=self.produced,
            )
        )
        self.publisher.flush()
        prompts.close()
        self.control.close()
        if self.receiver is not None:
            self.receiver.close()
        steps = getattr(self.engine, "steps", 0)
        if steps:  # the sim engine: how full its modelled batches were
            log.info(
                "worker %d: %d decoding steps, %.1f sequences per step (capacity %d)",
                *(
                    self.worker_id,
                    steps,
                    getattr(self.engine, "tokens", 0) / steps,
                    self.cfg.sim.capacity,
                ),
            )
        log.info(
            "worker %d: %d redelivered prompts were already published, %d logged partial "
            "samples continued, %d reward failures",
            *(self.worker_id, self.recovery.skipped, self.recovery.resumed),
            self.reward_failures,
        )
