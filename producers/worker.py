"""A rollout worker process: prompts in, scored samples out, weights from the trainer.

One thread runs everything, so a sync can never race with generation: between two decoding
steps the loop reads control events, admits prompts within the version's budget, advances
every in-flight trajectory by one token, scores trajectories as they finish (reward during
rollout), and publishes each sample as soon as its whole group is done and scored. A custom
reward function is called off the loop (``reward_pool``: custom_reward_function.num_workers
calls at once), so the engine keeps decoding while a slow reward is computed; the trajectory
is built when it finishes, so it keeps the version it finished under whatever happens while it
is scored. A sync's pause waits only for decoding: a sample whose trajectories have all
finished holds nothing the new weights change, so it is scored through the weight transfer and
published after it, under the versions it was generated with (in flight for the budget until
then). What must see every finished trajectory scored waits for the pending scores (drains):
a sample logged to ``partials`` (its record carries the rewards), a hand-back, a new trainer
and leaving.

A sync, on this side (docs/design.md, "A sync, as events on control"; the steps are
``producers.worker_sync``):
1. SyncRequested(v+1) arrives: stop admitting prompts.
2. Mode (c): in-flight samples finish decoding, and are published as their scores come back
   (before, during or after the transfer). Mode (d, ``partial_rollout``): they are interrupted
   before the next decoding step, and each with a trajectory cut short is published to
   ``partials`` once its finished trajectories are scored (its finished trajectories and the
   interrupted ones' tokens so far; a trajectory the abort found ended is finished). Publish
   RolloutPaused(v+1).
3. Receive the weights over the collective (in place); publish WeightsLoaded(v+1).
4. Mode (d): re-add every interrupted trajectory as a continuation of its prefix, before any
   new prompt; its next tokens form a new segment under v+1.
5. Open the budget of v+1 minus this worker's stale samples (partial ones included); publish
   RolloutResumed(v+1).

With ``async_training.in_flight_update`` (mode d), nothing pauses: the weights of v+1 arrive on
a thread into a second copy of the policy (``shadow_weights``) while the loop keeps generating
and admitting under v; once they and WeightsPublished(v+1) are in, the loop swaps them in
between two tokens, and steps 2-5 happen in that swap (nothing is logged to ``partials``).

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

import torch

from asyncrl.config import RunConfig
from asyncrl.producers.admission import PromptAdmission
from asyncrl.producers.agent.factory import make_runner
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.budget import RolloutBudget
from asyncrl.producers.completion import Completion
from asyncrl.producers.control_inbox import WorkerDisplaced
from asyncrl.producers.follower import JoinCancelled, SyncFollower, TrainerGone
from asyncrl.producers.in_flight import InFlightSamples
from asyncrl.producers.io import PromptFeed, WorkerIO, kafka_io
from asyncrl.producers.reward_pool import make_pool
from asyncrl.producers.scoring import TrajectoryScorer
from asyncrl.producers.shadow_weights import ShadowWeights
from asyncrl.producers.validation import RolloutValidator
from asyncrl.producers.worker_sync import WorkerSync
from asyncrl.telemetry import tracing

log = logging.getLogger(__name__)

__all__ = ["RolloutWorker", "TrainerGone"]

COLLECT_S = 0.005
"""How long the loop waits for a finished result of an engine on its own thread before it
reads control events and admits prompts again."""


class RolloutWorker(WorkerSync):
    def __init__(
        self,
        cfg: RunConfig,
        worker_id: int,
        bootstrap: str | None = None,
        io: WorkerIO | None = None,
    ) -> None:
        from asyncrl.models.flat import flatten_parameters
        from asyncrl.models.policy import resolve_device, rollout_dtype
        from asyncrl.models.warm_start import load_policy
        from asyncrl.producers.engines.factory import make_engine
        from asyncrl.producers.reward import make_reward

        self.cfg = cfg
        self.worker_id = worker_id
        tracing.init_tracing(cfg, f"asyncrl-rollout-{worker_id}")
        self.rollout = cfg.actor_rollout_ref.rollout
        self.partial_rollout = cfg.async_training.mode == "d"
        model, self.tokenizer = load_policy(cfg, dtype=rollout_dtype(cfg))
        device = resolve_device(self.rollout.device)
        model.to(device).eval()
        if device.type == "cuda":  # weights read in place are then one copy (models.flat)
            flatten_parameters(model)
        seed = cfg.trainer.seed + 1000 * (worker_id + 1)
        self.engine = make_engine(
            cfg, model, self.tokenizer, seed, thread=self.rollout.engine_thread
        )
        self.runner = make_runner(cfg, self.tokenizer, self.engine)
        """Every trajectory runs as an agent (one turn unless multi_turn.enable)."""
        reward = make_reward(cfg)
        self.score = TrajectoryScorer(
            reward,
            self.tokenizer,
            worker_id,
            overlong=cfg.algorithm.overlong_buffer,
            max_resp_len=cfg.data.max_response_length,
            pool=make_pool(cfg, reward),
        )
        """Scores each finished trajectory (the task's rule inline, or custom_reward_function
        on its pool, off the loop)."""
        if io is None:
            if bootstrap is None:
                raise ValueError("RolloutWorker needs a bootstrap address or an io")
            io = kafka_io(cfg, bootstrap, worker_id)
        self.io = io
        self.incarnation = io.control.incarnation
        """This process's lifetime; a restarted worker gets a new one (WorkerStarted says it)."""
        self.publisher = io.publisher
        self.follower = SyncFollower(
            cfg, worker_id, self.incarnation, io.control, io.weights, self.engine
        )
        """Versions, budget and the sync hand-shake with the trainer (producers.follower)."""
        self.full_batch = self.engine.full_batch or (
            self.rollout.max_concurrent_samples * self.rollout.n
        )
        """The engine's full batch, or where it has none what this worker may admit at once."""
        self.in_flight = InFlightSamples(self.runner, self.publisher, cfg.topic, self.rollout.n)
        self.validator = RolloutValidator(cfg, worker_id, io.control, self.tokenizer)
        """Held-out evaluation on this side (use_trainer_do_validate=false, worker 0)."""
        self.admission = PromptAdmission(
            cfg, worker_id, self.in_flight, self.tokenizer, io.scan_log
        )
        """Which prompt starts next: new, continued from the log, or already published."""
        self.filters = cfg.filters_groups
        self.done = Completion(
            worker_id, self.rollout.n, self.score, self.in_flight, lambda: self.budget, self.filters
        )
        """Scores finished trajectories, publishes whole samples, counts them."""
        self.produced_before = 0
        """Of ``produced``, the samples earlier incarnations of this worker id published."""
        self.stopping = False
        """Set by stop() (SIGTERM): leave the run, handing unfinished work back to the log."""
        self.displaced: str | None = None
        """Why this worker stopped for another process with its id (``WorkerDisplaced``)."""
        self.shadow: ShadowWeights | None = None
        """The in-flight update's second buffer (async_training.in_flight_update), once joined."""

    @property
    def produced(self) -> int:
        """Samples this worker id published (earlier incarnations' included)."""
        return self.done.produced

    @property
    def no_signal(self) -> int:
        """Of ``produced``, the groups dynamic sampling leaves out."""
        return self.done.no_signal

    @property
    def budget(self) -> RolloutBudget:
        return self.follower.budget

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
        f = self.follower
        # Subscribe first: the prompts group's join (~3 s on Tansu) then overlaps reading the
        # log, joining the collective and receiving the weights, instead of following them.
        prompts = self.done.prompts = self.io.prompts(
            self.admission.on_assigned, self._on_prompts_revoked
        )
        # A trajectory a sync's abort finds ended is scored and published as any other; a
        # hand-back that logs partials waits for those scores first (every trajectory of a
        # logged sample is then done or interrupted).
        self.in_flight.on_finished = self._on_finished
        self.in_flight.wait_scored = functools.partial(self.done.drain, keep_alive=False)
        f.keep_alive = prompts.keep_alive
        f.cancelled = lambda: self.stopping
        try:
            self._run(prompts)
        except JoinCancelled as why:  # SIGTERM or Ctrl-C before a trainer took this worker
            log.info("worker %d: %s", self.worker_id, why)
        except WorkerDisplaced as why:  # left as a crash leaves: the newer process recovers
            self.displaced = str(why)
            log.error("worker %d: %s", self.worker_id, why)
        finally:
            self._leave(prompts)
        return self.produced

    def _run(self, prompts: PromptFeed) -> None:
        """Join, then generate until the run finishes or the worker is stopped."""
        f = self.follower
        self._start()
        while not f.finished and not self.stopping:
            f.poll(0.0)
            self.done.collect()
            if self.shadow is not None:  # in-flight update: swap, between two tokens
                why = self.shadow.failed()
                if why and f.trainer_gone is None:
                    if f.run_finishing():
                        continue
                    f.trainer_gone = why
                ready = f.ready_to_swap(self.shadow.ready.is_set())
                if ready is not None:
                    self._swap(*ready)
            # A sync (or a new trainer) goes first once nothing has to finish decoding before
            # it (mode c); samples only being scored are published after it.
            if self.partial_rollout or not self.in_flight.num_generating():
                if f.trainer_gone is not None:
                    self._rejoin()
                    continue
                if f.pending_sync is not None and self.shadow is None:
                    self._sync(f.pending_sync)
                    continue
            while self._admit(prompts):
                pass
            self.publisher.poll(0)  # acknowledgements: commit the prompts of acked samples
            self.publisher.check()
            self._gauge()
            if self.runner.busy:
                self._advance()
            else:
                prompts.keep_alive()
                if self.score.pending:  # only rewards under way
                    self.done.collect(timeout=0.05)
                else:
                    f.poll(0.05)
        if self.stopping and self.partial_rollout and self.in_flight:
            self._interrupt()
        elif self.stopping:
            self.done.drain()  # publish what is scored; the rest is handed back

    def _start(self) -> None:
        """Read the log (what a previous incarnation left), join the collective, receive the
        trainer's weights and open this version's budget. First the engine makes room for
        the samples it may hold at once (hf_static's slots and CUDA graphs), while the prompts
        group's join goes on in the background."""
        t0 = time.perf_counter()
        data = self.cfg.data
        rows = self.rollout.max_concurrent_samples * self.rollout.n
        self.engine.prepare(rows, data.max_prompt_length + data.max_response_length)
        if (took := time.perf_counter() - t0) > 0.05:
            log.info(
                "worker %d: engine prepared for %d requests in %.2f s", self.worker_id, rows, took
            )
        self.io.control.start()
        # What a previous incarnation left on the partials log counts as stale, like work in
        # flight at a sync; continuing it takes no budget (producers.admission).
        self.done.produced = self.produced_before = self.admission.read_log()
        self.done.no_signal = self.admission.recovery.no_signal[self.worker_id]
        self._open_budget(self.follower.join())
        self._start_shadow()

    def _advance(self) -> None:
        """One decoding step of every sequence in flight (if any) and the tool results that
        came back; finished trajectories are scored, finished samples published."""
        decoding = self.engine.num_active > 0
        with torch.no_grad():
            for request_id, state in self.runner.step(timeout=COLLECT_S):
                self._on_finished(request_id, state)
        if not decoding:  # only tool calls (or user replies) under way
            self.follower.poll(0.002)

    def _gauge(self, syncing: bool = False) -> None:
        """Where this worker stands now, for its sync window's figures: idle, idle out of
        budget, how full the engine is, and its empty share with the budget spent (the
        throughput the staleness budget costs: a version's last long responses decoding
        alone while the worker may start nothing). ``syncing``: from the pause to the new
        budget the worker waits for the sync, not for budget."""
        f, spent = self.follower, not syncing and not self.budget.remaining
        busy = self.runner.busy
        f.idle.set_waiting(not busy)
        f.budget_idle.set_waiting(not busy and spent)
        fill = min(self.engine.num_active, self.full_batch) / self.full_batch
        f.occupancy.set(fill)
        f.budget_unfilled.set(1.0 - fill if spent else 0.0)

    # --- admission -----------------------------------------------------------------------------
    def _on_prompts_revoked(self, partitions: set[int], lost: bool) -> None:
        """Partitions move to another worker (producers.admission.hand_back), then the
        publisher is flushed, so the new owner's log scan sees every sample and partial of
        those partitions before it admits one of their prompts."""
        if self.follower.finished or self.stopping:
            return  # run() is ending; its clean-up hands everything back
        log_as = (self.worker_id, self.version) if self.partial_rollout and not lost else None
        if not lost:  # scored, a sample is published rather than handed back (or logged)
            self.done.drain(keep_alive=False)
        self.admission.hand_back(partitions, self.budget, log_as)
        self.publisher.flush()

    def _admit(self, prompts: PromptFeed) -> bool:
        """Start one sample unless a sync (that pauses) or a new trainer is awaited."""
        f = self.follower
        if (f.pending_sync is not None and self.shadow is None) or f.trainer_gone is not None:
            prompts.keep_alive()
            return False
        return self.admission.admit(prompts, self.budget, self.version)

    def _on_finished(self, request_id: str, state: AgentState) -> None:
        """A trajectory finished: scored, its sample published once whole (``completion``)."""
        self.done.on_finished(request_id, state)

    # --- the end ---------------------------------------------------------------------------------
    def _leave(self, prompts: PromptFeed) -> None:
        """The run is over for this worker: what is in flight is a logged drop (the run
        finished) or handed back to the group (stopped, or an error); WorkerStopped says why."""
        finished = self.follower.finished
        self.runner.close()
        self.engine.close()
        self.score.close()
        for sid in self.in_flight:
            self.in_flight[sid].trace.end(
                "run finished first" if finished else "handed back to the log"
            )
        reason = "error"
        if finished:
            reason = "run finished"
        elif self.stopping:
            reason = "stopped"
        elif self.displaced:
            reason = "displaced"
        self.follower.left(
            reason, self.produced, dropped=sorted(self.in_flight) if finished else []
        )
        self.publisher.flush()
        prompts.close()
        if self.shadow is not None:
            self.shadow.close()
        self.follower.close()
        log.info(
            "worker %d: %s, %d reward failures",
            *(self.worker_id, self.admission.summary(), self.score.failures),
        )
