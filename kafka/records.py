"""A run's topic read back, start to end (or a window of offsets or time): what the recovery
scan, the feed's idempotence check, the audit, inspect and replay all read with."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar

from asyncrl.config import RunConfig
from asyncrl.kafka.reader import Reader
from asyncrl.kafka.record import Record, raw_decode

LogScan = Callable[[str, "dict[int, int] | None"], Iterable[Record[bytes | None]]]
"""Raw records of a run's topic (by name), from a start offset per partition (None: from the
start) to its current end: how the worker's recovery scan reads the log, from Kafka
(``log_scan``) or from ``asyncrl.testing``'s memory broker."""


ReadProgress = Callable[[str, int], None]
"""Told (what is being read, e.g. a topic's name; records so far) as a long read goes on."""

_progress: ContextVar[ReadProgress | None] = ContextVar("asyncrl_read_progress", default=None)

REPORT_EVERY = 2000
"""Records between two reports: often enough for a live line, rarely enough to cost nothing."""


@contextlib.contextmanager
def reporting_progress(report: ReadProgress) -> Iterator[None]:
    """Within the block, reads of a run's log (``read_records``, an archive's restore) tell
    ``report`` how far they are: a long run's log is millions of records, and the tools that
    read it (audit, inspect, replay) ran for minutes with nothing on the screen."""
    token = _progress.set(report)
    try:
        yield
    finally:
        _progress.reset(token)


def progress_reporter() -> ReadProgress | None:
    """The ``report`` of the enclosing :func:`reporting_progress`, if any."""
    return _progress.get()


def progress_counter(what: str) -> Callable[[int], None]:
    """A counter of the records ``what`` ("reading demo.prompts") has done: called with the
    count so far, it tells the enclosing :func:`reporting_progress` each time the count passes
    another ``REPORT_EVERY``; outside one, it does nothing. What reads, restores or feeds a
    run's log counts through it."""
    report = progress_reporter()
    passed = 0

    def count(done: int) -> None:
        nonlocal passed
        if report is not None and done // REPORT_EVERY > passed:
            passed = done // REPORT_EVERY
            report(what, done)

    return count


def read_records(
    cfg: RunConfig,
    bootstrap: str,
    name: str,
    start: int = 0,
    end: int | None = None,
    timeout_s: float = 30.0,
    since_ms: int | None = None,
    until_ms: int | None = None,
    starts: dict[int, int] | None = None,
) -> Iterator[Record[bytes | None]]:
    """Raw records of the run's topic ``name`` with ``start <= offset < end`` (default: its
    current end), partition by partition in offset order. ``starts``: a start offset per
    partition instead, for those it names (where an earlier read stopped).

    ``since_ms``/``until_ms`` select by record timestamp, exactly: the broker's offset-for-time
    lookup only positions the read (Tansu answers the start of the record batch, which may hold
    earlier records), and every record is then checked against the requested time itself.

    ``timeout_s`` bounds a stall (no record read for that long), not the read: a long run's
    topics hold millions of records (its prompts: every step's, fed at the start), and a
    deadline on the whole read made resuming it, or auditing it, fail.
    """
    topic = cfg.topic(name)
    with Reader(cfg.kafka, bootstrap, raw_decode) as reader:
        highs = {p: high for p, (_low, high) in reader.watermarks(topic).items()}
        stops = {p: min(high, end) if end is not None else high for p, high in highs.items()}
        starts = {p: max(start, (starts or {}).get(p, start)) for p in stops}
        if since_ms is not None:
            for p, offset in reader.offsets_for_time(topic, since_ms).items():
                starts[p] = max(start, stops[p] if offset is None else offset)
        remaining = {p for p, stop in stops.items() if stop > starts[p]}
        if not remaining:
            return
        reader.assign(topic, {p: starts[p] for p in remaining})
        deadline = time.monotonic() + timeout_s
        counted, read = progress_counter(f"reading {topic}"), 0
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not read {topic} up to {stops}: no record for {timeout_s:.0f} s"
                )
            records = reader.poll(0.2)
            if records:
                deadline = time.monotonic() + timeout_s
                read += len(records)
                counted(read)
            for rec in records:
                in_time = (since_ms is None or rec.timestamp_ms >= since_ms) and (
                    until_ms is None or rec.timestamp_ms < until_ms
                )
                if rec.partition in remaining and rec.offset < stops[rec.partition] and in_time:
                    yield rec
                if rec.offset + 1 >= stops[rec.partition]:
                    remaining.discard(rec.partition)


def log_scan(cfg: RunConfig, bootstrap: str) -> LogScan:
    """``read_records`` of the run's topics on ``bootstrap``, as a ``LogScan``."""

    def scan(name: str, starts: dict[int, int] | None) -> Iterator[Record[bytes | None]]:
        return read_records(cfg, bootstrap, name, starts=starts)

    return scan
