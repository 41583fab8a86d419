"""What a rollout worker has read on control and not acted on yet: the syncs the trainer
requested, the weights it announced to this worker, budget refunds and grants, a restarted
trainer, the run's end, and another process announcing itself as this worker.

Each event is read against the version this worker holds; nothing here receives weights or
publishes. ``follower.SyncFollower``, the hand-shake that acts on what is read here
(docs/design.md, "A sync, as events on control"), is its subclass, so the worker asks one
object both what is pending and what to do about it.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from asyncrl.producers.budget import RolloutBudget
from asyncrl.schemas import control as ev
from asyncrl.sync.channel import ControlChannel, SyncTimeout


class WorkerDisplaced(RuntimeError):
    """Another process announced itself as this worker (the same ``--worker-id``) after this
    one had joined: the trainer takes the newer one in its place, as it takes a restarted
    worker's, so this one stops, as a crashed one would (its prompts in flight go back to the
    group). Two processes sharing an id would otherwise run on, one cut off from the weights."""


class ControlInbox:
    """One worker's reading of control: what is pending, what is owed, whether to go on."""

    def __init__(
        self, worker_id: int, incarnation: str, control: ControlChannel, budget: RolloutBudget
    ) -> None:
        self.worker_id = worker_id
        self.incarnation = incarnation
        self.control = control
        self.budget = budget
        self.version = 0
        """The version of the weights this worker holds: every event is read against it."""
        self.started_at = time.time()
        self.joined = False
        """Accepted by a trainer once: from then on another incarnation's WorkerStarted under
        this id displaces this one (before, this one may be the newer of two)."""
        self.requests: deque[ev.SyncRequested] = deque()
        """Syncs requested above this worker's version, oldest first (in-flight updates may
        fall behind by a version or two; the hand-shake with pauses holds at most one)."""
        self.published: dict[int, ev.WeightsPublished] = {}
        """WeightsPublished naming this incarnation, read before their version was taken."""
        self.refund_at: Counter[int] = Counter()
        """Refunds logged after a version's SyncRequested, for that version's budget."""
        self.counted_at_join: list[ev.ControlEvent] = []
        """Drops logged before the last join's welcome, not read yet: its ``consumed`` has them."""
        self.sync_seen_at = 0.0
        self.sync_seen_ns: int | None = None
        self.trainer_gone: str | None = None
        """Why the trainer this worker joined is gone (a new one must be joined), or None."""
        self.trainer_back = False
        """A new trainer's TrainerResumed has arrived (it hosts the collective by now)."""
        self.finished = False

    @property
    def pending_sync(self) -> ev.SyncRequested | None:
        """The oldest sync requested and not done yet."""
        return self.requests[0] if self.requests else None

    def sync_done(self) -> None:
        request = self.requests.popleft()
        self.published.pop(request.version, None)

    def poll(self, timeout: float) -> None:
        for event in self.control.poll(timeout):
            self.handle(event)

    def handle(self, event: ev.ControlEvent) -> None:
        if self._new_trainer(event):
            self.trainer_gone = f"a new trainer started (version {event.version})"
            self.trainer_back = True
        elif isinstance(event, ev.SyncRequested) and event.version > self._last_requested():
            self.requests.append(event)
            self.sync_seen_at = time.monotonic()
            self.sync_seen_ns = time.time_ns()
        elif (
            isinstance(event, ev.WeightsPublished)
            and event.version > self.version
            and self.incarnation in event.incarnations
        ):
            self.published[event.version] = event
        elif isinstance(event, (ev.SamplesDropped, ev.BudgetGranted)) and self._ours(event):
            self._refund(event)
        elif isinstance(event, ev.RunFinished):
            self.finished = True
        else:
            self._check_displaced(event)

    def _check_displaced(self, event: ev.ControlEvent) -> None:
        """Raise WorkerDisplaced on another process's announcement as this worker. Its time
        is compared with this process's start so that an announcement of a dead predecessor
        read back at start-up does not count (a worker reads control from its start's end)."""
        if (
            self.joined
            and isinstance(event, ev.WorkerStarted)
            and event.worker == self.worker_id
            and event.incarnation not in ("", self.incarnation)
            and event.ts > self.started_at
        ):
            raise WorkerDisplaced(
                f"another process started as worker {self.worker_id} (incarnation "
                f"{event.incarnation}; this one is {self.incarnation}) and takes its place: "
                "give each rollout worker its own --worker-id"
            )

    def _refund(self, event: ev.SamplesDropped | ev.BudgetGranted) -> None:
        """Give back the slots of samples of ours the trainer will not train, to the budget
        that counted them as stale (docs/design.md, "Versions and the budget").

        A version's budget opens with ``consumed`` as of its SyncRequested: a drop logged
        before that request is counted there as consumed, one logged after it as stale. So a
        drop logged after the newest request waits for that version's budget (the in-flight
        swap or the pause may come later than the event is read), and a drop logged before
        the welcome of a join refunds nothing (the welcome's ``consumed`` holds it)."""
        for i, counted in enumerate(self.counted_at_join):
            if counted is event:
                del self.counted_at_join[i]
                return
        if isinstance(event, ev.SamplesDropped) and self.requests:
            self.refund_at[self.requests[-1].version] += event.count
        else:
            self.budget.refund(event.count)

    def _last_requested(self) -> int:
        return self.requests[-1].version if self.requests else self.version

    def _ours(self, event: ev.SamplesDropped | ev.BudgetGranted) -> bool:
        """Samples the trainer dropped of ours, or a share of this version handed over to us."""
        if isinstance(event, ev.SamplesDropped):
            return event.target_worker == self.worker_id
        return event.target_worker == self.worker_id and event.version == self.version

    def _new_trainer(self, event: ev.ControlEvent) -> bool:
        """A TrainerResumed of a trainer this worker has not joined: its versions are above
        every version on the log, so above this worker's, unlike the one it joined."""
        return isinstance(event, ev.TrainerResumed) and event.version > self.version

    def ready_to_swap(self, received: bool) -> tuple[ev.SyncRequested, ev.WeightsPublished] | None:
        """The oldest sync requested, once its weights are received (``received``) and the
        trainer has announced them (the version, checksum and members come with that)."""
        request = self.pending_sync
        if not received or request is None or request.version not in self.published:
            return None
        return request, self.published[request.version]

    def run_finishing(self, grace_s: float = 2.0) -> bool:
        """Whether RunFinished arrives within ``grace_s``: the trainer closes its weight pairs
        right after publishing it, so a worker receiving in the background sees its pair close
        before it reads the event, and must not take that for a trainer that died."""
        if self.finished:
            return True
        try:
            self.control.wait_for(ev.RunFinished, timeout_s=grace_s)
        except SyncTimeout:
            return False
        self.finished = True
        return True
