"""Prompts from the ``prompts`` topic for one rollout worker, as a member of the workers' group.

Why the pausing: the group's ``max.poll.interval.ms`` is kept short (7 s), so a worker that is
not taking prompts (budget spent, or all slots busy) must keep polling to stay in the group. It
tops up a local buffer of ``prefetch`` prompts, pauses its partitions once the buffer is full
and resumes them only when it is down to half. Pausing is not free: librdkafka drops its
fetched queue on pause, and on Tansu the first records after a resume take 0.4-1 s to arrive.
So a worker must neither pause at every busy moment (it would wait out that delay most of the
time) nor resume as soon as one prompt is taken (every resume would wait it out with the buffer
nearly empty: the demo's worker takes ~40 prompts/s from a buffer of 32). Resuming at half a
buffer of at least ``MIN_PREFETCH`` prompts lets the refetch overlap with the half still
buffered.

Offsets are committed only up to the first prompt not yet turned into a published sample
(``done`` must be called after the sample is acknowledged by the broker), so a crash loses
no prompt: at worst one is generated twice.

A source leaves its group without a LeaveGroup (``Reader.close(leave_group=False)``): the
group drops the member when its session times out, as if the worker had crashed. On Tansu
0.6 a LeaveGroup can wedge the group for good, and a timed-out member never does: a group
that is forming keeps its leader, and a LeaveGroup while it forms removes the member without
clearing it, so if the leader left no member can complete the round and nothing is assigned
again (a worker that failed during start-up, mid-join, left its restart waiting for prompts
for good; a worker stopped while another joined left the run's prompts unassigned and the
trainer waited for samples until it timed out). Tansu's session expiry clears the leader.
The price: a stopped worker's partitions move after one session timeout (2 s on the
embedded broker, 6 s by default elsewhere) instead of at once. A join of its own under way
is waited out first (``kafka.group_watch``: releasing the client mid-join can hang).

A rebalance (a worker joins or leaves) moves some partitions to another worker. Before they
are released, ``on_revoke`` lets the worker hand back what it holds of them (stop generating
those prompts; in mode d, log their partials), then their offsets are committed synchronously
up to the first prompt still open; the new owner gets the rest again, and ``on_assign`` tells
it to re-read the log first (some of them may be published or logged as partials already).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from asyncrl.config import RunConfig
from asyncrl.config.kafka import EXTERNAL_SESSION_TIMEOUT_MS
from asyncrl.kafka import Publisher, Reader, Record
from asyncrl.schemas.prompt import PromptRecord, decode_prompt

log = logging.getLogger(__name__)

STARVED_WARN_S = 30.0
"""A worker that wants prompts and has owned no partition for this long says why it may be."""

MIN_PREFETCH = 256
"""Prompts a worker buffers at most (at least this many: prompts are small), so that the half
it resumes at outlasts the refetch after a resume at a few hundred samples/s."""


class PromptSource:
    def __init__(
        self,
        cfg: RunConfig,
        bootstrap: str,
        dead_letter: tuple[Publisher, str] | None = None,
        prefetch: int | None = None,
        on_assign: Callable[[set[int]], None] | None = None,
        on_revoke: Callable[[set[int], bool], None] | None = None,
    ) -> None:
        self.on_assign = on_assign
        """Called with the partitions newly assigned (they may bring redelivered prompts)."""
        self.on_revoke = on_revoke
        """Called with the partitions moving away, and whether they are lost already (no
        commit possible): the caller stops working on their prompts (see the module doc)."""
        self.topic = cfg.topic("prompts")
        self.prefetch = prefetch or max(
            MIN_PREFETCH,
            2 * cfg.max_samples_per_version + cfg.actor_rollout_ref.rollout.max_concurrent_samples,
        )
        self.reader: Reader[PromptRecord] = Reader(
            cfg.kafka,
            bootstrap,
            decode_prompt,
            group_id=f"{cfg.run_id}.rollout",
            dead_letter=dead_letter,
            watch_group=True,
        )
        self.paused = False
        self._assigned = False
        self._buffer: list[Record[PromptRecord]] = []
        self._open: dict[int, set[int]] = {}  # partition -> offsets taken, not yet done
        self._next_commit: dict[int, int] = {}  # partition -> highest offset taken + 1
        self.owned: set[int] = set()
        self._closing = False
        self.joined = False
        """The group has answered this member's join (an assignment, maybe empty)."""
        session_ms = cfg.kafka.session_timeout_ms or EXTERNAL_SESSION_TIMEOUT_MS
        self.join_wait_s = 2 * session_ms / 1000 + 2
        """How long ``close`` waits for a join under way to end: a Tansu join takes about
        half the session timeout, one after a dead member's expiry about two."""
        self.partitions = cfg.kafka.topics.partitions.get("prompts")
        self._unowned_since: float | None = time.monotonic()
        """Since when this member has owned no partition (its start, or when it lost its
        last one); None: warned for this stretch. Read only while it owns none."""
        self.reader.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=functools.partial(self._on_revoke, lost=False),
            on_lost=functools.partial(self._on_revoke, lost=True),
        )

    # --- group membership -------------------------------------------------------------------
    def _on_assign(self, partitions: list[tuple[str, int]]) -> None:
        self.joined = True
        added = {p for _topic, p in partitions}
        if not added or self._closing:
            return
        self.owned |= added
        self._assigned = True  # new partitions start unpaused: keep_alive pauses them again
        if self.on_assign is not None:
            self.on_assign(added)

    def _on_revoke(self, partitions: list[tuple[str, int]], lost: bool) -> None:
        moving = {p for _topic, p in partitions} & self.owned
        if not moving or self._closing:
            return
        self._buffer = [r for r in self._buffer if r.partition not in moving]
        if self.on_revoke is not None:
            self.on_revoke(moving, lost)
        if not lost:
            try:
                self.commit(partitions=moving)
            except KafkaException as err:  # the new owner redoes a little more; nothing is lost
                log.warning("commit of revoked prompt partitions %s failed: %s", moving, err)
        self.owned -= moving
        if not self.owned:
            self._unowned_since = time.monotonic()
        for p in moving:
            self._open.pop(p, None)
            self._next_commit.pop(p, None)
        log.info("prompt partitions %s moved to another worker", sorted(moving))

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.reader.pause_all()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.reader.resume_all()

    # --- taking prompts -----------------------------------------------------------------------
    def keep_alive(self) -> None:
        """Poll without taking anything: keeps the group membership, tops up the buffer
        (paused from full until down to half: see the module doc)."""
        held = len(self._buffer)
        if held >= self.prefetch or (self.paused and held > self.prefetch // 2):
            if not self.paused or self._assigned:
                self.paused = True
                self._assigned = False
                self.reader.pause_all()
            self._buffer.extend(self.reader.poll(0.0))
        else:
            self.resume()
            self._buffer.extend(self.reader.poll(0.0, max_records=self.prefetch - held))

    def take(self, timeout: float) -> Record[PromptRecord] | None:
        """The next prompt, or None if none arrived within ``timeout`` seconds."""
        if not self._buffer:
            self.resume()
            self._buffer.extend(self.reader.poll(timeout, max_records=self.prefetch))
        if not self._buffer:
            self._check_starved()
            return None
        return self._taken(self._buffer.pop(0))

    def _check_starved(self) -> None:
        """Wanting prompts and owning no partition for ``STARVED_WARN_S``: say why it may be,
        once per such stretch (a worker with nothing to do looks the same as a stuck one)."""
        since = self._unowned_since
        if self.owned or since is None or time.monotonic() - since < STARVED_WARN_S:
            return
        log.warning(
            "this worker has owned no prompt partition for %.0f s while it wants prompts: more "
            "workers than the topic's %s partitions (kafka.topics.partitions.prompts), or a "
            "group rebalance that never completed (on the embedded broker, see Tansu's quirks "
            "in docs/design.md)",
            *(time.monotonic() - since, self.partitions or "?"),
        )
        self._unowned_since = None

    def take_where(self, wanted: Callable[[Record[PromptRecord]], bool]) -> Record | None:
        """The first prompt already buffered that ``wanted`` accepts, out of order (None: none
        is). For prompts a worker must take before others, e.g. its own logged partials."""
        for i, rec in enumerate(self._buffer):
            if wanted(rec):
                del self._buffer[i]
                return self._taken(rec)
        return None

    def _taken(self, rec: Record[PromptRecord]) -> Record[PromptRecord]:
        self._open.setdefault(rec.partition, set()).add(rec.offset)
        self._next_commit[rec.partition] = max(
            self._next_commit.get(rec.partition, 0), rec.offset + 1
        )
        return rec

    def done(self, rec: Record[PromptRecord]) -> None:
        """The sample for ``rec`` is acknowledged: commit as far as nothing earlier is open.

        Asynchronously: a commit lost in a crash only means a prompt is redelivered, and the
        restarted worker finds its sample on the log (see ``recovery``). ``close`` commits
        synchronously. The worker calls this from the sample's delivery callback, on the
        publisher that also carries dead-letter copies: an asynchronous commit never flushes
        it (it stops below a bad prompt whose copy is not acknowledged yet, and the copy's
        acknowledgement moves it on; see ``asyncrl.kafka``).
        """
        if rec.partition not in self._open:  # moved to another worker meanwhile
            return
        self._open[rec.partition].discard(rec.offset)
        self.commit(asynchronous=True)

    def commit(self, asynchronous: bool = False, partitions: set[int] | None = None) -> None:
        offsets = {}
        for partition, high in self._next_commit.items():
            if partition not in self.owned or (
                partitions is not None and partition not in partitions
            ):
                continue
            # Not past a prompt still open, nor past one buffered and not taken yet (a prompt
            # taken out of order, take_where, may be done before earlier ones).
            waiting = set(self._open.get(partition, ()))
            waiting |= {r.offset for r in self._buffer if r.partition == partition}
            offsets[(self.topic, partition)] = min(waiting) if waiting else high
        if offsets:
            self.reader.commit(offsets, asynchronous=asynchronous)

    @property
    def in_progress(self) -> int:
        return sum(len(s) for s in self._open.values())

    def close(self) -> None:
        """Commit what is done and leave the group by session expiry (the module doc): what
        is still open goes to the partitions' next owner. A join of this member under way
        is waited out first (``kafka.group_watch``), polling with everything paused; what
        the polls fetch is dropped, uncommitted."""
        try:
            self.commit()
        except KafkaException as err:  # as at a revocation: the next owner re-reads the log
            # A worker that joined mid-run, ending while the group rebalanced (another
            # worker's session expiring): ILLEGAL_GENERATION ended it in a traceback, and
            # the process then stayed up with its consumer never released.
            log.warning("commit of prompt partitions %s on leaving failed: %s", self.owned, err)
        self._closing = True  # nothing is handed back from here: the next owner re-reads
        assert self.reader.group is not None  # watched: see __init__
        deadline = time.monotonic() + self.join_wait_s
        while not self.reader.group.quiet() and time.monotonic() < deadline:
            self.reader.pause_all()
            self.reader.poll(0.05)
        if self.reader.group.quiet():
            self.reader.close(leave_group=False)
            return
        log.warning(
            "the prompts group kept this worker rebalancing for %.0f s: leaving it with a "
            "LeaveGroup, which on Tansu may leave the other workers without prompts",
            self.join_wait_s,
        )
        self.reader.close()
