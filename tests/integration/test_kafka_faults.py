"""Kafka clients under faults (issue 16): a bad record dead-lettered from a delivery callback,
a consumer that missed its max.poll.interval, a dead broker, an unreachable bootstrap."""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from asyncrl.config import RunConfig
from asyncrl.kafka import BrokerUnavailable, Publisher, Reader, Record, raw_decode
from asyncrl.kafka.topics import create_run_topics
from asyncrl.launch.broker import EmbeddedBroker, free_port
from asyncrl.producers import prompt_source
from asyncrl.producers.prompt_source import PromptSource
from asyncrl.schemas.prompt import PromptRecord, encode_prompt

pytestmark = pytest.mark.kafka

# Fast group settings: librdkafka requires max.poll.interval.ms >= session.timeout.ms.
SHORT_POLL = (
    "kafka.max_poll_interval_ms=2000",
    "kafka.session_timeout_ms=1500",
    "kafka.heartbeat_interval_ms=200",
)


def _feed_prompts(cfg: RunConfig, broker: str, count: int) -> None:
    """Prompts p0, p1, ... on the run's prompts topic."""
    with Publisher(cfg.kafka, broker) as feed:
        for i in range(count):
            feed.publish(
                cfg.topic("prompts"), f"p{i}", encode_prompt(PromptRecord(f"p{i}", "", ""))
            )


def _poll_until(reader: Reader, done: Callable[[list[Record]], bool], timeout: float) -> list:
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    while not done(out) and time.monotonic() < deadline:
        out += reader.poll(0.1)
    return out


def test_dead_letter_from_a_delivery_callback_commits_past_the_bad_prompt(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """The worker's path: ``PromptSource.done`` runs inside the sample's delivery callback of
    the publisher that also carries the dead-letter copies; it must not flush that publisher."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=1")
    prompts, dlq = cfg.topic("prompts"), cfg.topic("dead-letter")
    values = [encode_prompt(PromptRecord(f"p{i}", f"{i}+1=", str(i + 1))) for i in range(5)]
    values[2] = b"garbage"
    with Publisher(cfg.kafka, broker) as feed:
        for i, v in enumerate(values):
            feed.publish(prompts, f"p{i}", v)

    pub = Publisher(cfg.kafka, broker)  # one publisher for samples and dead letters, as the worker
    source = PromptSource(cfg, broker, dead_letter=(pub, dlq))
    try:
        taken = []
        deadline = time.monotonic() + 20
        while len(taken) < 4 and time.monotonic() < deadline:
            rec = source.take(0.2)
            if rec is not None:
                taken.append(rec)
        assert [r.offset for r in taken] == [0, 1, 3, 4]
        assert source.reader.dead_lettered == 1
        for rec in taken:
            pub.publish(
                cfg.topic("samples"),
                rec.value.sample_id,
                b"sample",
                on_acked=functools.partial(source.done, rec),
            )
        t0 = time.monotonic()
        pub.flush(timeout=10)  # serves the delivery callbacks: done() commits from inside one
        assert time.monotonic() - t0 < 5

        committed: dict = {}
        deadline = time.monotonic() + 10
        while committed.get((prompts, 0)) != 5 and time.monotonic() < deadline:
            source.reader.poll(0.1)  # serves the async commits' results
            committed = source.reader.committed([(prompts, 0)])
        assert committed == {(prompts, 0): 5}  # past the bad record, with no sync commit
    finally:
        source.close()
        pub.flush()

    with Reader(cfg.kafka, broker, raw_decode) as dl_reader:
        dl_reader.assign(dlq)
        dead = _poll_until(dl_reader, lambda out: len(out) >= 1, 10)
    assert [(r.key, r.value) for r in dead] == [("p2", b"garbage")]
    assert dead[0].headers["source-offset"] == b"2"
    assert b"not an Arrow IPC stream" in dead[0].headers["error"]


def test_commit_stops_before_a_bad_record_whose_copy_is_not_acknowledged(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """A crash before the dead-letter copy is acknowledged re-reads the bad record."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=1")
    prompts, dlq = cfg.topic("prompts"), cfg.topic("dead-letter")

    def decode(value: bytes | None, headers: dict[str, bytes]) -> bytes:
        from asyncrl.schemas import DecodeError

        if value == b"bad":
            raise DecodeError("bad value")
        return value or b""

    with Publisher(cfg.kafka, broker) as feed:
        for v in (b"ok0", b"bad", b"ok2"):
            feed.publish(prompts, None, v)
    pub = Publisher(cfg.kafka, broker)
    with Reader(
        cfg.kafka, broker, decode, group_id=f"{cfg.run_id}.g", dead_letter=(pub, dlq)
    ) as reader:
        reader.subscribe([prompts])
        got = _poll_until(reader, lambda out: len(out) >= 2, 20)
        assert [r.offset for r in got] == [0, 2]
        assert len(pub) == 1  # the copy is queued, not yet acknowledged (nothing polled it)
        reader.commit({(prompts, 0): 3}, asynchronous=True)
        deadline = time.monotonic() + 5
        committed = None
        while committed != 1 and time.monotonic() < deadline:
            reader.poll(0.05)
            committed = reader.committed([(prompts, 0)])[(prompts, 0)]
        assert committed == 1  # capped at the bad record
        pub.flush()  # the copy is acknowledged: the capped commit is redone up to 3
        deadline = time.monotonic() + 5
        while committed != 3 and time.monotonic() < deadline:
            reader.poll(0.05)
            committed = reader.committed([(prompts, 0)])[(prompts, 0)]
        assert committed == 3


def test_a_reader_that_missed_max_poll_interval_rejoins(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """A stall longer than max.poll.interval.ms (a SIGSTOPped broker, a long GC) is survived:
    the consumer leaves the group, and the next polls rejoin it and read on."""
    cfg = make_run_cfg(*SHORT_POLL)
    topic = cfg.topic("prompts")
    with Publisher(cfg.kafka, broker) as pub:
        for i in range(4):
            pub.publish(topic, f"a{i}", f"a{i}".encode())
    lost: list = []
    with Reader(cfg.kafka, broker, raw_decode, group_id=f"{cfg.run_id}.g") as reader:
        reader.subscribe([topic], on_lost=lost.append, on_revoke=lambda parts: None)
        first = _poll_until(reader, lambda out: len(out) >= 4, 20)
        assert len(first) == 4
        reader.commit({(r.topic, r.partition): r.offset + 1 for r in first})
        time.sleep(3.5)  # no poll for longer than max.poll.interval.ms (2 s)
        with Publisher(cfg.kafka, broker) as pub:
            for i in range(4):
                pub.publish(topic, f"b{i}", f"b{i}".encode())
        again = _poll_until(reader, lambda out: len({r.value for r in out}) >= 4, 30)
    assert {r.value for r in again} == {f"b{i}".encode() for i in range(4)}


def _own_broker_cfg(
    make_run_cfg: Callable[..., RunConfig], bootstrap: str, *overrides: str
) -> RunConfig:
    return make_run_cfg(
        f"kafka.bootstrap_servers='{bootstrap}'",
        "kafka.broker_down_timeout_s=3",
        *overrides,
        create_topics=False,
    )


def test_a_dead_broker_fails_a_flush_with_broker_unavailable_quickly_and_quietly(
    make_run_cfg: Callable[..., RunConfig],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = EmbeddedBroker()
    bootstrap = own.start()
    try:
        cfg = _own_broker_cfg(make_run_cfg, bootstrap)
        create_run_topics(cfg, bootstrap)
        pub = Publisher(cfg.kafka, bootstrap)
        pub.publish(cfg.topic("samples"), "k", b"before")
        pub.flush()
    finally:
        own.stop()
    capfd.readouterr()
    caplog.clear()
    t0 = time.monotonic()
    pub.publish(cfg.topic("samples"), "k", b"after")
    with pytest.raises(BrokerUnavailable) as info:
        pub.flush(timeout=60)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert "kafka.bootstrap_servers" in msg and bootstrap in msg and "\n" not in msg
    assert elapsed < 3 + 4, elapsed
    stderr = capfd.readouterr().err.splitlines()
    assert len(stderr) <= 2, stderr
    kafka_lines = [r for r in caplog.records if r.name.startswith("asyncrl.kafka")]
    assert len(kafka_lines) <= 3, [r.getMessage() for r in kafka_lines]


def test_an_unreachable_bootstrap_fails_publisher_and_reader_the_same_way(
    make_run_cfg: Callable[..., RunConfig],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    # Nothing ever answers: each client gives up after the whole broker_down_timeout_s, four
    # times over, so 1 s here (3 s, the other tests', took 12 s of waiting).
    cfg = _own_broker_cfg(make_run_cfg, bootstrap, "kafka.broker_down_timeout_s=1")
    bound = cfg.kafka.broker_down_timeout_s + 4
    capfd.readouterr()

    t0 = time.monotonic()
    pub = Publisher(cfg.kafka, bootstrap)
    pub.publish("anything", "k", b"v")
    with pytest.raises(BrokerUnavailable, match=r"kafka\.bootstrap_servers"):
        pub.flush(timeout=60)
    assert time.monotonic() - t0 < bound

    t0 = time.monotonic()
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.g") as reader:
        reader.subscribe(["anything"])
        with pytest.raises(BrokerUnavailable, match=bootstrap):
            while time.monotonic() - t0 < 30:
                reader.poll(0.1)
    assert time.monotonic() - t0 < bound

    t0 = time.monotonic()
    with (
        Reader(cfg.kafka, bootstrap, raw_decode) as reader,
        pytest.raises(BrokerUnavailable, match=r"kafka\.bootstrap_servers"),
    ):
        reader.assign("anything")
    assert time.monotonic() - t0 < bound

    with pytest.raises(BrokerUnavailable, match=r"kafka\.bootstrap_servers"):
        create_run_topics(cfg, bootstrap)
    assert time.monotonic() - t0 < 2 * bound

    stderr = capfd.readouterr().err.splitlines()
    assert len(stderr) <= 4, stderr
    kafka_lines = [r for r in caplog.records if r.name.startswith("asyncrl.kafka")]
    assert len(kafka_lines) <= 8, [r.getMessage() for r in kafka_lines]


def test_a_worker_stalled_by_a_sigstopped_broker_goes_on_after_it_resumes(
    make_run_cfg: Callable[..., RunConfig],
) -> None:
    """The issue's stall, scaled down: the broker stops answering (there ~10 s past
    max.poll.interval.ms 7 s; here 5 s past 2 s, SHORT_POLL), so a flush blocks the
    worker's loop past max.poll.interval.ms; once the broker is back, flush and poll go on
    (the consumer rejoins its group) instead of raising _MAX_POLL_EXCEEDED."""
    own = EmbeddedBroker()
    bootstrap = own.start()
    try:
        cfg = _own_broker_cfg(
            make_run_cfg, bootstrap, *SHORT_POLL, "kafka.broker_down_timeout_s=15"
        )
        create_run_topics(cfg, bootstrap)
        topic = cfg.topic("prompts")
        pub = Publisher(cfg.kafka, bootstrap)
        for i in range(4):
            pub.publish(topic, f"a{i}", f"a{i}".encode())
        pub.flush()
        with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.g") as reader:
            reader.subscribe([topic], on_revoke=lambda parts: None)
            assert len(_poll_until(reader, lambda out: len(out) >= 4, 20)) == 4
            assert own.pid is not None
            os.kill(own.pid, signal.SIGSTOP)
            timer = threading.Timer(5.0, os.kill, (own.pid, signal.SIGCONT))
            timer.start()
            try:
                for i in range(4):
                    pub.publish(topic, f"b{i}", f"b{i}".encode())
                pub.flush(timeout=60)  # blocks until the broker answers again (~5 s)
            finally:
                timer.join()
            again = _poll_until(
                reader, lambda out: {b"b0", b"b1", b"b2", b"b3"} <= {r.value for r in out}, 40
            )
            assert {b"b0", b"b1", b"b2", b"b3"} <= {r.value for r in again}
    finally:
        own.stop()


def test_a_full_prompt_buffer_resumes_only_at_half(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """Fetching after a resume is slow on Tansu (0.4-1 s): resuming as soon as one prompt was
    taken from a full buffer made every refetch start with the buffer nearly drained (the
    demo's worker starved ~0.5 s every 5 steps). Paused at full, it resumes at half."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=1")
    _feed_prompts(cfg, broker, 40)
    source = PromptSource(cfg, broker, prefetch=8)
    try:
        deadline = time.monotonic() + 20
        while not source.paused and time.monotonic() < deadline:
            source.keep_alive()
            time.sleep(0.05)
        assert source.paused and len(source._buffer) >= 8
        taken = []
        while len(source._buffer) > 5:
            taken.append(source.take(0.0))
            source.keep_alive()
            assert source.paused, f"resumed with {len(source._buffer)} of 8 buffered"
        taken.append(source.take(0.0))
        source.keep_alive()  # down to half: fetch again
        assert not source.paused
        assert [r.offset for r in taken] == list(range(len(taken)))  # in order, none lost
    finally:
        source.close()


def test_a_source_closed_before_its_first_assignment_leaves_the_group_usable(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """Tansu wedges a group that a member leaves (LeaveGroup) before its join completes: no
    later member is ever assigned a partition (a restarted worker waited for prompts for
    good). A source leaves by session expiry instead (prompt_source's module doc)."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=2")
    _feed_prompts(cfg, broker, 4)
    first = PromptSource(cfg, broker)
    _keep_alive(first, seconds=1.0)  # its JoinGroup sent, not answered yet (~1 s)
    assert not first.joined
    first.close()
    second = PromptSource(cfg, broker)
    try:
        taken = None
        deadline = time.monotonic() + 30
        while taken is None and time.monotonic() < deadline:
            taken = second.take(0.2)
        assert taken is not None, "the group assigned the next member nothing"
        assert second.owned == {0, 1}
    finally:
        second.close()


def test_a_worker_stopped_while_another_joins_leaves_the_group_usable(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """Tansu wedges a forming group that its leader leaves (LeaveGroup): two workers own the
    prompt partitions, a third joins, and the first (the group's leader) is stopped while
    the group forms. Before, nothing more was assigned (in a run, the trainer waited for
    samples until it timed out); waiting for the group to settle first only narrowed the
    window (one try in six still wedged). A source leaves by session expiry now."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=4")
    everything = {0, 1, 2, 3}
    _feed_prompts(cfg, broker, 8)
    leader = PromptSource(cfg, broker)  # the first member: the group's leader
    _keep_alive(leader, until=lambda: leader.owned == everything)
    other = PromptSource(cfg, broker)
    _keep_alive(leader, other, until=lambda: bool(other.owned) and len(leader.owned) < 4)
    assert leader.owned | other.owned == everything
    _keep_alive(leader, other, seconds=1.0)  # the cooperative rebalance's last round
    joining = PromptSource(cfg, broker)
    _keep_alive(leader, other, joining, seconds=0.3)  # its JoinGroup is out: the group forms
    assert not joining.joined
    leader.close()
    try:
        _keep_alive(
            other,
            joining,
            until=lambda: (
                other.owned | joining.owned == everything and bool(other.owned and joining.owned)
            ),
        )
        assert other.owned | joining.owned == everything, "the group wedged: nothing moved"
        assert other.owned and joining.owned
    finally:
        other.close()
        joining.close()


def _keep_alive(
    *sources: PromptSource, seconds: float = 30.0, until: Callable[[], bool] | None = None
) -> None:
    """Keep the sources polling for ``seconds``, or until ``until()`` (at most 30 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until is not None and until()):
        for s in sources:
            s.keep_alive()
        time.sleep(0.05)


def test_a_worker_left_without_prompt_partitions_says_why_it_may_be(
    make_run_cfg: Callable[..., RunConfig], broker: str, monkeypatch, caplog
) -> None:
    """A worker owning no partition looks like one that is stuck: after a while of wanting
    prompts it says why it may be (more workers than partitions, or a stuck rebalance)."""
    monkeypatch.setattr(prompt_source, "STARVED_WARN_S", 1.0)
    cfg = make_run_cfg("kafka.topics.partitions.prompts=1", "kafka.session_timeout_ms=2000")
    _feed_prompts(cfg, broker, 1)
    first = PromptSource(cfg, broker)
    second = PromptSource(cfg, broker)
    try:
        deadline = time.monotonic() + 30
        while not (first.joined and second.joined) and time.monotonic() < deadline:
            first.keep_alive()
            second.keep_alive()
            time.sleep(0.05)
        starved, owner = (first, second) if not first.owned else (second, first)
        assert owner.owned == {0} and not starved.owned
        with caplog.at_level(logging.WARNING, logger=prompt_source.__name__):
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                owner.keep_alive()
                assert starved.take(0.1) is None
        said = [
            r.getMessage() for r in caplog.records if "owned no prompt partition" in r.getMessage()
        ]
        assert len(said) == 1 and "the topic's 1 partitions" in said[0]
        # A worker that owned its partition a long while and has just lost it (the group's
        # revoke, here called as the group would) is not starved yet.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=prompt_source.__name__):
            owner._on_revoke([(cfg.topic("prompts"), 0)], lost=True)
            assert not owner.owned and owner.take(0.1) is None
        assert not [r for r in caplog.records if "owned no prompt" in r.getMessage()]
    finally:
        first.close()
        second.close()


def test_a_paused_source_that_missed_max_poll_interval_takes_prompts_again(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """A worker stopped (SIGSTOP, a debugger, a stalled VM) past max.poll.interval.ms with its
    prompt partitions paused (buffer full) loses them, and the group gives them back. Before,
    librdkafka kept them paused across the loss and the re-assignment while the source took
    itself for resumed: the worker never took a prompt again and the trainer waited for good
    (a standalone broker, 4 runs of 4)."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=2", *SHORT_POLL)
    _feed_prompts(cfg, broker, 40)
    source = PromptSource(cfg, broker, prefetch=8)
    try:
        _keep_alive(source, until=lambda: source.paused and len(source._buffer) >= 8)
        assert source.paused and source.owned == {0, 1}
        time.sleep(3.5)  # no poll for longer than max.poll.interval.ms (2 s): the group's gone
        taken: list[Record[PromptRecord]] = []
        deadline = time.monotonic() + 40
        while len(taken) < 20 and time.monotonic() < deadline:
            source.keep_alive()  # what a worker with its budget spent does: the loss lands here
            rec = source.take(0.2)
            if rec is not None:
                taken.append(rec)
        assert len(taken) >= 20, f"took {len(taken)} prompts after the stall: partitions paused"
        assert source.owned == {0, 1}
    finally:
        source.close()
