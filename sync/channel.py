"""The ``control`` topic as a typed channel of weight-version events, for one process.

Each process reads the topic from where it stood when it started (the high watermark), so
a restarted process does not replay an old sync. ``wait_for`` keeps every other event it
reads for the next ``poll``, so waiting for one event never swallows another.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

from asyncrl.config import RunConfig
from asyncrl.kafka import Publisher, Reader
from asyncrl.kafka.interfaces import Sink, Source
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev

E = TypeVar("E", bound=ev.ControlEvent)


def last_logged_version(cfg: RunConfig, bootstrap: str) -> int:
    """The highest weight version on the run's control topic (-1 if none): a resumed trainer
    publishes its weights above it, so a version number is never reused for other weights."""
    from asyncrl.kafka.records import read_records
    from asyncrl.schemas import DecodeError

    events = []
    for rec in read_records(cfg, bootstrap, "control"):
        try:
            events.append(ev.decode_event(rec.value, rec.headers))
        except DecodeError:
            continue  # dead-lettered by the trainer that read it first
    return highest_version(events)


def highest_version(events: Iterable[ev.ControlEvent]) -> int:
    """The highest version SyncRequested, WeightsPublished or TrainerResumed names (-1 if
    none). A TrainerResumed's version is taken even if its trainer died before publishing
    it: the next restart took that number again (audit: a version regression)."""
    named = (ev.SyncRequested, ev.WeightsPublished, ev.TrainerResumed)
    return max((e.version for e in events if isinstance(e, named)), default=-1)


class SyncTimeout(TimeoutError):
    """An expected control event did not arrive; the message says which and from whom."""


class ControlChannel:
    def __init__(
        self,
        cfg: RunConfig,
        publisher: Sink,
        reader: Source[ev.ControlEvent],
        worker: int = ev.TRAINER,
        timeout_s: float | None = None,
        incarnation: str = "",
    ) -> None:
        self.cfg = cfg
        self.topic = cfg.topic("control")
        self.publisher = publisher
        self.reader = reader
        self.worker = worker
        self.incarnation = incarnation
        """Stamped on every event this process publishes (workers; "" for the trainer)."""
        self.timeout_s = timeout_s if timeout_s is not None else cfg.sync.timeout_s
        self._pending: deque[ev.ControlEvent] = deque()
        self._started = False

    @classmethod
    def connect(
        cls,
        cfg: RunConfig,
        bootstrap: str,
        publisher: Publisher,
        worker: int = ev.TRAINER,
        timeout_s: float | None = None,
        incarnation: str = "",
    ) -> ControlChannel:
        """A channel over Kafka. Every process reads the whole control topic: only the trainer
        copies a bad record to dead-letter (once per run, not once per process); workers skip
        it with a warning."""
        dead_letter = (publisher, cfg.topic("dead-letter")) if worker == ev.TRAINER else None
        reader = Reader(
            cfg.kafka,
            bootstrap,
            ev.decode_event,
            dead_letter=dead_letter,
            skipped_because="the trainer copies bad control records to dead-letter",
        )
        return cls(cfg, publisher, reader, worker, timeout_s, incarnation)

    def start(self, from_beginning: bool = False) -> None:
        """Position the reader: at the current end (default), or at the start for a replay."""
        offsets = None
        if not from_beginning:
            offsets = {p: high for p, (_low, high) in self.reader.watermarks(self.topic).items()}
        self.reader.assign(self.topic, offsets)
        self._started = True

    def publish(self, event: ev.ControlEvent, flush: bool = True) -> None:
        if self.incarnation and not event.incarnation:
            event.incarnation = self.incarnation
        self.publisher.publish(
            self.topic,
            self.cfg.run_id,
            ev.encode_event(event),
            headers={SCHEMA_HEADER: event.tag()},
        )
        if flush:
            self.publisher.flush()

    def poll(self, timeout: float) -> list[ev.ControlEvent]:
        """Events not yet handed out, oldest first."""
        if not self._pending:
            self._pending.extend(r.value for r in self.reader.poll(timeout))
        events = list(self._pending)
        self._pending.clear()
        return events

    def wait_for(
        self,
        kind: type[E],
        version: int | None = None,
        worker: int | None = None,
        timeout_s: float | None = None,
        where: Callable[[E], bool] | None = None,
        idle: Callable[[], None] | None = None,
    ) -> E:
        """Block until an event of ``kind`` (optionally for a version/worker, or passing
        ``where``) arrives; ``idle`` is called between polls (a worker keeps polling its
        consumer group)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        kept: list[ev.ControlEvent] = []
        try:
            while True:
                while self._pending:
                    event = self._pending.popleft()
                    if (
                        isinstance(event, kind)
                        and (version is None or event.version == version)
                        and (worker is None or event.worker == worker)
                        and (where is None or where(event))
                    ):
                        return event
                    kept.append(event)
                left = deadline - time.monotonic()
                if left <= 0:
                    what = kind.__name__ + (f"(version={version})" if version is not None else "")
                    who = f" from worker {worker}" if worker is not None else ""
                    raise SyncTimeout(
                        f"no {what}{who} on {self.topic} within "
                        f"{timeout_s if timeout_s is not None else self.timeout_s:.0f} s "
                        f"(sync.timeout_s); check the other processes' logs in {self.cfg.run_dir / 'logs'}"
                    )
                self._pending.extend(r.value for r in self.reader.poll(min(left, 0.1)))
                if idle is not None:
                    idle()
        finally:
            self._pending.extendleft(reversed(kept))

    def close(self) -> None:
        self.reader.close()
