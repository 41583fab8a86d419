"""``asyncrl monitor RUN --once`` of a live run shows the log as it was when it looked, over
an in-memory broker: ``--once`` of a running demo printed 'published 298 trained 352 queue lag
-54', the steps read on past the samples the run wrote meanwhile."""

from __future__ import annotations

import io

from rich.console import Console

from asyncrl.config import load_config
from asyncrl.kafka import raw_decode
from asyncrl.ops import monitor
from asyncrl.ops.monitor_stats import RunMonitor
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.sample import TAG as SAMPLE_TAG
from asyncrl.schemas.sample import Sample, Trajectory, encode_sample
from asyncrl.schemas.step import TAG as STEP_TAG
from asyncrl.schemas.step import StepRecord, encode_step
from asyncrl.testing import MemoryBroker

CFG = load_config(overrides=["run_id=r"])


def _step(broker: MemoryBroker, n: int) -> None:
    """Two samples, then the step that trains them, as the run writes them."""
    ids = [f"s{n}a", f"s{n}b"]
    for sid in ids:
        sample = Sample(sid, sid, 0, [1], "1", [Trajectory([3], [-0.1], 1.0)])
        headers = {SCHEMA_HEADER: SAMPLE_TAG.encode()}
        broker.append(CFG.topic("samples"), sid, encode_sample(sample), headers)
    rec = StepRecord("r", n, 0, float(n), ids, [0, 0], [2 * n - 2, 2 * n - 1])
    broker.append(CFG.topic("steps"), "r", encode_step(rec), {SCHEMA_HEADER: STEP_TAG.encode()})


class LiveRun:
    """A reader over ``broker`` while the run writes on: step 3 (and its samples) once the
    monitor polls; with ``racing``, step 2 right after the monitor asked for the first
    topic's ends, between two of its watermark reads."""

    def __init__(self, broker: MemoryBroker, racing: bool = False) -> None:
        self.inner = broker.reader(raw_decode)
        self.broker = broker
        self.racing = racing
        self.asked = self.polled = 0

    def watermarks(self, topic: str, exact: bool = True) -> dict[int, tuple[int, int]]:
        marks = self.inner.watermarks(topic, exact)
        self.asked += 1
        if self.racing and self.asked == 1:
            _step(self.broker, 2)
        return marks

    def poll(self, timeout: float, max_records: int = 500):
        self.polled += 1
        if self.polled == 1:
            _step(self.broker, 3)
        return self.inner.poll(timeout, max_records)

    def assign(self, topic: str, offsets=None) -> None:
        self.inner.assign(topic, offsets)


def _once(reader: LiveRun) -> RunMonitor:
    """``monitor --once`` with the plain engine."""
    mon = RunMonitor()
    topics = [CFG.topic(name) for name in monitor.TOPICS]
    console = Console(file=io.StringIO())
    monitor._watch(mon, CFG, reader, "-", "kafka", topics, console, False, 0.0, None)
    return mon


def test_once_shows_the_log_as_it_was() -> None:
    broker = MemoryBroker()
    for n in (1, 2):
        _step(broker, n)
    mon = _once(LiveRun(broker))
    assert (mon.published, mon.trained, mon.lag) == (4, 4, 0)


def test_a_step_written_between_two_watermark_reads_has_its_samples() -> None:
    broker = MemoryBroker()
    _step(broker, 1)
    mon = _once(LiveRun(broker, racing=True))
    assert mon.trained <= mon.published and mon.lag >= 0
