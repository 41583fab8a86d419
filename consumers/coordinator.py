"""The trainer's side of the weight collective: who is a member, and the sync hand-shake.

A sync, in this order (docs/design.md, "A sync, as events on control"):
1. Publish SyncRequested(v+1) with what the trainer has consumed of each worker.
2. Wait until every member has published RolloutPaused(v+1). A worker that (re)joins meanwhile
   has nothing in flight: it counts as paused and gets this sync's weights. One that does not
   pause within ``sync.timeout_s`` is dropped from the collective. (Not with
   ``async_training.in_flight_update``: the workers receive in the background and swap the
   weights in between two tokens, so the broadcast goes at once.)
3. The version is v+1: broadcast the weights in buckets, then publish WeightsPublished(v+1,
   checksum, the incarnations reached, the members the new version's budget is split among).
4. Do not wait for the workers to load and resume: their RolloutResumed events, read later,
   close the sync's metrics row (``sync`` in ``metrics.jsonl``).

Membership: a worker announces itself (WorkerStarted) and is accepted into the collective; outside
a sync it gets the current weights at once, if they are still those of the current version. If
the trainer has updated them since (``trigger_parameter_sync_step`` > 1: local updates between
syncs), sending them under the current version would give that version two sets of weights, and
the joiner's samples the wrong version: it is ``deferred`` instead, and the trainer syncs a new
version before its next step (the joiner counts as paused: nothing is in flight there). A new
incarnation of a member replaces the old one.
A worker that stops (WorkerStopped), or whose pair fails, leaves; what it had not delivered of
its share of the current version is granted to the others (BudgetGranted), or the version might
never fill.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from opentelemetry import trace
from opentelemetry.trace import Span

from asyncrl.config import RunConfig
from asyncrl.consumers import spans
from asyncrl.consumers.staleness_guard import StalenessGuard
from asyncrl.consumers.step_stats import ROLLOUTER_RATIOS, param_sync_metrics
from asyncrl.producers.budget import worker_share
from asyncrl.schemas import control as ev
from asyncrl.sync.channel import ControlChannel
from asyncrl.sync.transport import WeightSource
from asyncrl.telemetry.metrics import WaitClock

log = logging.getLogger(__name__)


Position = Callable[[], tuple[int, dict[int, int]]]
"""The trainer's step and samples consumed per worker, for the events that carry them."""


VERSIONS_KEPT = 16
"""Per-version bookkeeping is kept for the current version and this many before it: a
worker's RolloutResumed or WeightsLoaded comes milliseconds after its sync (an in-flight
update's, one version late at most), a leaving worker's share is of the current version.
Older versions' entries are folded into the run's totals and forgotten, so a long run's
trainer does not grow with its syncs."""

RESUMES_WAIT_S = 0.5
"""At the run's end, how long the summary waits for the last syncs' RolloutResumed (a worker
resumes tens of ms after a sync; one that died never does)."""


class SyncCoordinator:
    def __init__(
        self,
        cfg: RunConfig,
        control: ControlChannel,
        model: torch.nn.Module,
        checksum: Callable[[torch.dtype | None], str],
        position: Position,
        write_row: Callable[[dict[str, Any]], None],
        wait_clock: WaitClock,
        version: int = 0,
        sender: WeightSource | None = None,
    ) -> None:
        self.cfg = cfg
        self.control = control
        self.sender = sender
        """The weight transport's sending end (None: a trainer with no workers to feed); set
        when the trainer's loop starts, which is when workers can join."""
        self._medium: tuple[int, int, str] | None = None
        """Workers served through shared memory, over the collective, and how (the
        TransferStats medium)."""
        self.model = model
        self.checksum = checksum
        """The current weights' checksum, cast to a dtype (None: as they are)."""
        self.wire_dtype = _wire_dtype(cfg, model)
        """The workers' dtype, which each sync casts the weights to (None: the trainer's)."""
        self.position = position
        self.write_row = write_row
        self.version = version
        self.num_workers = cfg.actor_rollout_ref.rollout.num_workers
        self.wait_clock = wait_clock
        """The trainer's waits (for samples, and here for pauses): trainer/idle_ratio."""
        self.received: Counter[tuple[int, int]] = Counter()
        """Samples read per (worker, param_version): what a leaving worker delivered."""
        self.shared_among: dict[int, list[int]] = {}
        """Per version opened at a sync: the members its budget was split among."""
        self.unresumed: dict[int, set[int]] = {}
        """Per version: the members that have not published RolloutResumed for it yet."""
        self.requested_ts: dict[int, float] = {}
        """Wall time each version's SyncRequested was published (event ``ts``)."""
        self.resumed_s: dict[int, float] = {}
        """Per version: SyncRequested -> the last member's RolloutResumed, a whole sync."""
        self.load_s: dict[int, float] = {}
        """Per version: the slowest worker's receive + load (WeightsLoaded.load_s)."""
        self.trainer_side: dict[int, dict[str, float]] = {}
        """Per version: the trainer's side of its sync (pause wait, transfer)."""
        self.pauses = RunningStats()
        """The trainer's wait for the workers' pauses, per sync."""
        self.resumes_forgotten = RunningStats()
        """``resumed_s`` of the versions forgotten (``VERSIONS_KEPT``)."""
        self.requested_forgotten = 0
        """Syncs requested whose versions were forgotten."""
        self.validations: list[ev.Validated] = []
        """Rollout-side held-out evaluations read and not yet taken by the trainer's loop."""
        self.rollouter: dict[str, dict[int, float]] = {key: {} for key in ROLLOUTER_RATIOS}
        """Per metric (``rollouter/...``), each worker's value over its last sync window."""
        self.first_join: float | None = None
        """When the first worker got its weights: rollout could start (benchmarks time from it)."""
        self._published_at = position()[0]
        """The trainer's step when the weights of ``version`` were published (or loaded)."""
        self.deferred: dict[int, str] = {}
        """Workers (-> incarnation) that joined after an update: they get the next version's
        weights, at a sync the trainer starts before its next step."""
        self.staleness = StalenessGuard(cfg)
        """The version lineage, and what of it the next step may train (its ``screen``); fed
        the versions this trainer publishes, after the log's history (``take_version_above``)."""

    def take_version_above(
        self,
        last: int,
        step: int,
        resumed: bool,
        history: list[ev.ControlEvent] | None = None,
    ) -> ev.TrainerResumed | None:
        """A restarted trainer's weights are those of its checkpoint, but an earlier trainer may
        have published later versions before it died (checkpoints are written before a sync,
        and not at every step). Reusing those numbers would give one version two sets of
        weights; the checkpoint's weights get the next free number above ``last`` (the log's
        highest) instead, and the restart is logged (the TrainerResumed returned, published
        once the collective is up: workers join on it), which also marks the earlier trainer's
        later steps as void. None for a fresh run. ``history``: the control log so far, which
        places the earlier trainers' versions on the lineage."""
        for event in history or []:
            self.staleness.lineage.feed(event)
        if last < 0 and not resumed:
            return None
        checkpoint_version = self.version
        self.version = max(checkpoint_version, last + 1)
        log.info(
            "resumed at step %d: the checkpoint's weights (version %d) are published as "
            "version %d (the log holds versions up to %d)",
            *(step, checkpoint_version, self.version, last),
        )
        self.staleness.lineage.resumed(self.version, step, checkpoint_version)
        return ev.TrainerResumed(
            run_id=self.cfg.run_id,
            version=self.version,
            step=step,
            checkpoint_version=checkpoint_version,
            last_logged_version=last,
        )

    @property
    def current(self) -> bool:
        """The model holds the weights of ``version``: no update since they were published."""
        return self.position()[0] == self._published_at

    @property
    def members(self) -> dict[int, str]:
        """worker -> incarnation of every worker in the weight collective."""
        return self.sender.members if self.sender is not None else {}

    # --- weights --------------------------------------------------------------------------------
    def publish_weights(self, pause_wait_s: float = 0.0, workers: list[int] | None = None) -> None:
        """Send the current weights to ``workers`` (default: every member) and announce them
        on ``control``, naming the incarnations that received them."""
        step, consumed = self.position()
        stats_bytes, buckets, transfer_s = 0, 0, 0.0
        delivered: dict[int, str] = {}
        if self.sender is not None:
            sent = self.sender.broadcast(
                self.model, self.cfg.sync.bucket_bytes, workers, dtype=self.wire_dtype
            )
            stats_bytes, buckets = sent.stats.bytes, sent.stats.buckets
            transfer_s, delivered = sent.stats.seconds, sent.delivered
            medium = (sent.stats.shared, len(delivered) - sent.stats.shared, sent.stats.medium)
            if delivered and medium != self._medium:  # said once, and again when it changes
                self._medium = medium
                log.info(
                    "weights reach %d worker(s) through shared memory, %d over the collective (%s)",
                    *medium,
                )
        checksum = self.checksum(self.wire_dtype) if self.cfg.sync.verify_checksum else ""
        if workers is None and step > 0:  # a sync: the new version is split among these
            self.shared_among[self.version] = sorted(self.members)
        self.staleness.lineage.published(self.version, step)
        self.control.publish(
            ev.WeightsPublished(
                run_id=self.cfg.run_id,
                version=self.version,
                transfer_s=transfer_s,
                pause_wait_s=pause_wait_s,
                bytes=stats_bytes,
                buckets=buckets,
                checksum=checksum,
                step=step,
                incarnations=sorted(delivered.values()),
                consumed={str(w): c for w, c in consumed.items()},
                # A joiner takes its share of the version as it was split ([]: the
                # configured shares, at start-up), not as if it had been there at the sync.
                members=self.shared_among.get(self.version, []),
            )
        )
        if workers is None:
            self._published_at = step
            self.deferred.clear()
            self.trainer_side[self.version] = {"pause_s": pause_wait_s, "transfer_s": transfer_s}
            if step > 0:
                self.pauses.add(pause_wait_s)

    def sync(self, trigger: Span = trace.INVALID_SPAN) -> dict[str, float]:
        """Steps 1-3 of the module docstring; returns the sync's ``timing_s/param_sync*``."""
        t0 = time.monotonic()
        step, consumed = self.position()
        new_version = self.version + 1
        request = ev.SyncRequested(
            run_id=self.cfg.run_id,
            version=new_version,
            step=step,
            consumed={str(w): c for w, c in consumed.items()},
        )
        self.requested_ts[new_version] = request.ts
        with trace.use_span(spans.sync_span(new_version, trigger), end_on_exit=True):
            self.control.publish(request)  # carries this span's context to the workers
            if not self.cfg.async_training.in_flight_update:  # in flight: nobody pauses
                with spans.phase("sync.pause"), self.wait_clock.waiting():
                    self._wait_for_pauses(new_version)
            self.version = new_version
            with spans.phase("sync.transfer"):
                self.publish_weights(pause_wait_s=time.monotonic() - t0)
        self.unresumed[new_version] = set(self.members)
        side = self.trainer_side[new_version]
        self._forget_before(new_version - VERSIONS_KEPT)
        return param_sync_metrics(time.monotonic() - t0, side["pause_s"], side["transfer_s"])

    def _wait_for_pauses(self, version: int) -> None:
        """Until every member has paused for ``version`` (step 2); a deferred joiner has
        nothing in flight."""
        waiting = {w: i for w, i in self.members.items() if self.deferred.get(w) != i}
        deadline = time.monotonic() + self.cfg.sync.timeout_s
        while waiting:
            for event in self.control.poll(0.1):
                if isinstance(event, ev.RolloutPaused) and event.version == version:
                    if waiting.get(event.worker) == event.incarnation:
                        del waiting[event.worker]
                elif isinstance(event, ev.WorkerStarted):
                    if self.join(event, syncing=True):
                        waiting.pop(event.worker, None)
                else:
                    self.on_event(event)
            for worker in set(waiting) - set(self.members):  # left during the wait
                del waiting[worker]
            if waiting and time.monotonic() > deadline:
                for worker in waiting:
                    self.leave(worker, f"no RolloutPaused({version}) within sync.timeout_s")
                break

    # --- membership -----------------------------------------------------------------------------
    def join(self, event: ev.WorkerStarted, syncing: bool = False) -> bool:
        """Accept a worker's announcement; outside a sync, send it the current weights now.

        Returns True if the worker is (now) a member. Repeated announcements of a member are
        ignored; a new incarnation replaces the old one, which is gone.
        """
        if self.sender is None or self.members.get(event.worker) == event.incarnation:
            return self.sender is not None
        old = self.members.get(event.worker)
        if not self.sender.connect(event.worker, event.incarnation):
            return False
        log.info(
            "worker %d joined (incarnation %s%s)",
            event.worker,
            event.incarnation,
            f", replacing {old}" if old else "",
        )
        if syncing:
            pass  # this sync's weights reach it: it counts as paused
        elif self.current:
            self.publish_weights(workers=[event.worker])
        else:
            self.deferred[event.worker] = event.incarnation
            log.info(
                "worker %d joined after the weights moved past version %d: it gets version "
                "%d, synced before the next step",
                *(event.worker, self.version, self.version + 1),
            )
        if self.first_join is None:
            self.first_join = time.monotonic()
        return True

    def leave(self, worker: int, why: str, level: int = logging.WARNING) -> None:
        """``level``: INFO for a worker that said it stops (WorkerStopped), WARNING else."""
        if self.sender is not None and worker in self.members:
            log.log(level, "worker %d leaves the weight collective: %s", worker, why)
            self.sender.disconnect(worker)
            self._hand_over_share(worker)

    def _hand_over_share(self, worker: int) -> None:
        """A worker left mid-version: grant the others what it had not delivered of its share,
        or the version might never fill (its prompts are redelivered to them).

        Its share is computed as the worker computed it (budget.py); what it delivered is what
        arrived here from it under this version. Its stale samples are not subtracted (the
        trainer does not know them), so the grant can exceed what is missing by those.
        """
        v, total = self.version, self.cfg.max_samples_per_version
        members = self.shared_among.get(v)
        if members is None:  # opened at start-up: the configured shares
            if not 0 <= worker < self.num_workers:
                return
            share = worker_share(total, self.num_workers, worker)
        elif worker in members:
            share = worker_share(total, len(members), members.index(worker))
        else:
            return
        missing = share - self.received[(worker, v)]
        rest = sorted(self.members)
        for i, w in enumerate(rest):
            count = worker_share(max(missing, 0), len(rest), i)
            if count:
                self.control.publish(
                    ev.BudgetGranted(
                        run_id=self.cfg.run_id,
                        version=v,
                        target_worker=w,
                        count=count,
                        reason=f"worker {worker} left with {missing} of its share undelivered",
                    )
                )

    # --- events ---------------------------------------------------------------------------------
    def handle_control(self) -> None:
        """Serve what arrived on ``control`` without waiting (between two steps)."""
        for event in self.control.poll(0.0):
            if isinstance(event, ev.WorkerStarted):
                self.join(event)
            else:
                self.on_event(event)

    def on_event(self, event: ev.ControlEvent) -> None:
        if isinstance(event, ev.WeightsLoaded) and event.version in self.requested_ts:
            self.load_s[event.version] = max(event.load_s, self.load_s.get(event.version, 0.0))
        if isinstance(event, ev.RolloutResumed):
            for key, field in ROLLOUTER_RATIOS.items():
                value = getattr(event, field)
                if value >= 0:  # -1: a worker that does not measure it
                    self.rollouter[key][event.worker] = value
            requested = self.requested_ts.get(event.version)
            if requested is not None:  # the last worker to resume ends the sync
                took = event.ts - requested
                self.resumed_s[event.version] = max(took, self.resumed_s.get(event.version, 0.0))
                self._resumed_by(event.version, event.worker)
        elif isinstance(event, ev.Validated):
            self.validations.append(event)
        elif isinstance(event, ev.WeightsLoaded) and not event.checksum_ok:
            raise RuntimeError(
                f"worker {event.worker} loaded weights of version {event.version} that "
                "differ from the trainer's (checksum mismatch)"
            )
        elif (
            isinstance(event, ev.WorkerStopped)
            and self.members.get(event.worker) == event.incarnation
        ):
            why = event.reason if event.reason.startswith("stop") else f"stopped ({event.reason})"
            self.leave(event.worker, why, logging.INFO)

    def _resumed_by(self, version: int, worker: int) -> None:
        """Once every member resumed ``version``, log the whole sync as one metrics row (step 4)."""
        waiting = self.unresumed.get(version)
        if waiting is None:
            return
        waiting.discard(worker)
        waiting &= set(self.members)  # a worker that left will not answer
        if waiting:
            return
        del self.unresumed[version]
        side = self.trainer_side.get(version, {})
        self.write_row(
            {
                "sync": {
                    "version": version,
                    "pause_s": side.get("pause_s", 0.0),
                    "transfer_s": side.get("transfer_s", 0.0),
                    "load_s": self.load_s.get(version, 0.0),
                    "resumed_s": self.resumed_s[version],
                }
            }
        )

    def _forget_before(self, version: int) -> None:
        """Drop the per-version entries of versions below ``version`` (``VERSIONS_KEPT``); a
        forgotten version's time to resume counts in the summary's figures still."""
        for v in [v for v in self.requested_ts if v < version]:
            del self.requested_ts[v]
            self.requested_forgotten += 1
            if v in self.resumed_s:
                self.resumes_forgotten.add(self.resumed_s.pop(v))
        _drop_below(self.resumed_s, version)
        _drop_below(self.load_s, version)
        _drop_below(self.trainer_side, version)
        _drop_below(self.unresumed, version)
        _drop_below(self.shared_among, version)
        for key in [k for k in self.received if k[1] < version]:
            del self.received[key]

    def summary(self, wait_s: float = RESUMES_WAIT_S) -> dict[str, Any]:
        """The run's syncs, for the trainer's summary. The times to resume are of the syncs
        whose last RolloutResumed this trainer read (waiting up to ``wait_s`` for those it
        has not: it trains on while the workers resume); None where it read none."""
        self._read_resumes(wait_s)
        resumed = RunningStats()
        resumed.merge(self.resumes_forgotten)
        for took in self.resumed_s.values():
            resumed.add(took)
        requested = len(self.requested_ts) + self.requested_forgotten
        return {
            "syncs": self.pauses.count,
            "sync_pause_s_mean": self.pauses.mean or 0.0,
            "sync_pause_s_max": self.pauses.max,
            "sync_resumed_s_mean": resumed.mean,
            "sync_resumed_s_max": resumed.max if resumed.count else None,
            "sync_resumed_seen": f"{resumed.count} of {requested}",
        }

    def _read_resumes(self, wait_s: float) -> None:
        """Read ``control`` for the RolloutResumed events of requested syncs not yet seen to
        end, up to ``wait_s`` (the run is over: other events are left unserved)."""
        deadline = time.monotonic() + wait_s
        while (
            any(v not in self.resumed_s for v in self.requested_ts) and time.monotonic() < deadline
        ):
            for event in self.control.poll(0.05):
                if isinstance(event, ev.RolloutResumed):
                    self.on_event(event)

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()


def _drop_below(per_version: dict[int, Any], version: int) -> None:
    for v in [v for v in per_version if v < version]:
        del per_version[v]


@dataclass
class RunningStats:
    """Count, sum and largest of a series, without keeping it."""

    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, x: float) -> None:
        self.count += 1
        self.total += x
        self.max = x if self.count == 1 else max(self.max, x)

    def merge(self, other: RunningStats) -> None:
        if other.count:
            self.max = other.max if not self.count else max(self.max, other.max)
            self.count += other.count
            self.total += other.total

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


def _wire_dtype(cfg: RunConfig, model: torch.nn.Module) -> torch.dtype | None:
    """``rollout.dtype`` resolved, where it differs from the trainer's floating-point dtype."""
    from asyncrl.models.policy import rollout_dtype

    wanted = rollout_dtype(cfg)
    have = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    return None if have == {wanted} else wanted
