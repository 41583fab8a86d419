"""Publisher, Reader and topic admin against the real (embedded Tansu) broker."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from asyncrl.config import RunConfig
from asyncrl.kafka import (
    MessageTooLarge,
    Publisher,
    Reader,
    Record,
    UnknownTopic,
    consumer_config,
    count_records,
    raw_decode,
    read_topics_watermarks,
    read_watermarks,
)
from asyncrl.kafka.topics import RUN_TOPICS, create_run_topics, delete_run_topics
from asyncrl.schemas import DecodeError

pytestmark = pytest.mark.kafka


def _poll_n(reader: Reader, n: int, timeout: float = 10.0) -> list[Record]:
    """Poll until ``n`` records arrived or ``timeout`` passed (then return what arrived)."""
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += reader.poll(0.1)
    return out


def _topic_partitions(bootstrap: str) -> dict[str, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5)
    return {name: len(t.partitions) for name, t in md.topics.items()}


def test_topics_created_with_configured_partitions(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    cfg = make_run_cfg("kafka.max_message_bytes=2097152", create_topics=False)
    # (a dotted override of one partitions key replaces the whole dict: set it here instead)
    cfg.kafka.topics.partitions = {**cfg.kafka.topics.partitions, "prompts": 3}
    assert create_run_topics(cfg, broker) == [cfg.topic(n) for n in RUN_TOPICS]
    have = _topic_partitions(broker)
    for name in RUN_TOPICS:
        assert have[cfg.topic(name)] == cfg.kafka.topics.partitions[name]
    assert have[cfg.topic("prompts")] == 3
    # idempotent: a second call with topics present is fine
    assert create_run_topics(cfg, broker) == [cfg.topic(n) for n in RUN_TOPICS]
    res = ConfigResource(ResourceType.TOPIC, cfg.topic("samples"))
    admin = AdminClient({"bootstrap.servers": broker})
    entries = admin.describe_configs([res])[res].result(timeout=5)
    assert entries["max.message.bytes"].value == "2097152"

    assert sorted(delete_run_topics(cfg, broker)) == sorted(cfg.topic(n) for n in RUN_TOPICS)
    assert not any(cfg.topic(n) in _topic_partitions(broker) for n in RUN_TOPICS)


def test_one_partition_override_keeps_the_other_defaults(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    cfg = make_run_cfg("kafka.topics.partitions.prompts=3", create_topics=False)
    create_run_topics(cfg, broker)
    with Reader(cfg.kafka, broker, raw_decode) as reader:
        assert len(reader.partitions(cfg.topic("prompts"))) == 3
        assert len(reader.partitions(cfg.topic("samples"))) == 1


def test_publish_read_round_trip_with_headers(run_cfg: RunConfig, broker: str) -> None:
    topic = run_cfg.topic("samples")
    sent = [
        ("k0", b"v0", {"asyncrl-schema": "sample/1", "bin": b"\x00\xff"}, 1_700_000_000_000),
        (None, b"v1", None, 1_700_000_000_001),
        ("k2", b"", {"h": "x"}, 1_700_000_000_002),
    ]
    with Publisher(run_cfg.kafka, broker) as pub:
        for key, value, headers, ts in sent:
            pub.publish(topic, key, value, headers=headers, timestamp_ms=ts)
    assert pub.delivered == 3
    assert count_records(run_cfg.kafka, broker, topic) == 3

    with Reader(run_cfg.kafka, broker, raw_decode) as reader:
        reader.assign(topic)
        got = _poll_n(reader, 3)
        assert [(r.key, r.value, r.timestamp_ms, r.offset) for r in got] == [
            (k, v, ts, i) for i, (k, v, _, ts) in enumerate(sent)
        ]
        assert got[0].headers == {"asyncrl-schema": b"sample/1", "bin": b"\x00\xff"}
        assert got[1].headers == {}
        assert got[2].headers == {"h": b"x"}
        assert reader.position() == {(topic, 0): 3}
        assert reader.watermarks(topic) == {0: (0, 3)}

        # assign from an explicit offset replaces the earlier assignment of the topic
        reader.assign(topic, {0: 2})
        assert [r.offset for r in _poll_n(reader, 1)] == [2]


def test_too_large_is_refused_before_sending(make_run_cfg: Callable[..., RunConfig]) -> None:
    cfg = make_run_cfg("kafka.max_message_bytes=4096")
    bootstrap = cfg.kafka.bootstrap_servers
    assert bootstrap is not None
    topic = cfg.topic("samples")
    with Publisher(cfg.kafka, bootstrap) as pub:
        with pytest.raises(MessageTooLarge) as info:
            pub.publish(topic, "big-one", b"x" * 5000)
        assert len(pub) == 0
        pub.publish(topic, "small", b"x" * 1000)
    msg = str(info.value)
    assert topic in msg and "big-one" in msg and "5007" in msg
    assert "kafka.max_message_bytes" in msg
    assert count_records(cfg.kafka, bootstrap, topic) == 1


def test_undecodable_messages_go_to_dead_letter(run_cfg: RunConfig, broker: str) -> None:
    topic, dlq = run_cfg.topic("samples"), run_cfg.topic("dead-letter")
    values = [b"ok0", b"bad1", b"ok2", b"ok3", b"bad4", b"ok5"]

    def decode(value: bytes | None, headers: dict[str, bytes]) -> str:
        assert value is not None
        if value.startswith(b"bad"):
            raise DecodeError(f"cannot decode {value!r}")
        return value.decode()

    with Publisher(run_cfg.kafka, broker) as pub:
        for i, v in enumerate(values):
            pub.publish(topic, f"key{i}", v, headers={"asyncrl-schema": "sample/1"})

    with (
        Publisher(run_cfg.kafka, broker) as dl_pub,
        Reader(run_cfg.kafka, broker, decode, dead_letter=(dl_pub, dlq)) as reader,
    ):
        reader.assign(topic)
        got = _poll_n(reader, 4)
        assert [(r.offset, r.key, r.value) for r in got] == [
            (0, "key0", "ok0"),
            (2, "key2", "ok2"),
            (3, "key3", "ok3"),
            (5, "key5", "ok5"),
        ]
        assert reader.dead_lettered == 2
        assert reader.poll(0.2) == []  # goes on; nothing else pending

    with Reader(run_cfg.kafka, broker, raw_decode) as dl_reader:
        dl_reader.assign(dlq)
        dead = _poll_n(dl_reader, 2)
    assert [(r.key, r.value) for r in dead] == [("key1", b"bad1"), ("key4", b"bad4")]
    for rec, offset in zip(dead, (1, 4), strict=True):
        assert rec.headers["error"] == f"cannot decode {rec.value!r}".encode()
        assert rec.headers["source-topic"] == topic.encode()
        assert rec.headers["source-partition"] == b"0"
        assert rec.headers["source-offset"] == str(offset).encode()
        assert rec.headers["asyncrl-schema"] == b"sample/1"


def test_a_sample_with_a_null_token_is_dead_lettered_and_the_good_ones_decode_as_arrays(
    run_cfg: RunConfig, broker: str
) -> None:
    """Token columns decode as numpy views; a message that is valid Arrow but holds a null
    token (once decoded with a None inside) goes to the dead-letter topic, saying so."""
    import numpy as np
    import pyarrow as pa

    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.codec import encode_batch
    from asyncrl.schemas.sample import (
        SCHEMA,
        TAG,
        Sample,
        Trajectory,
        decode_sample,
        encode_sample,
        sample_columns,
    )

    topic, dlq = run_cfg.topic("samples"), run_cfg.topic("dead-letter")
    good = Sample("g@0", "g", 0, [1, 2], "3", [Trajectory([5, 6, 2], [-0.5] * 3, 1.0)])
    cols = sample_columns(good)
    cols["response_ids"] = pa.array([[5, None, 2]], pa.list_(pa.int32()))
    bad = encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))
    with Publisher(run_cfg.kafka, broker) as pub:
        for key, value in (("good", encode_sample(good)), ("bad", bad)):
            pub.publish(topic, key, value, headers={SCHEMA_HEADER: TAG})
    with (
        Publisher(run_cfg.kafka, broker) as dl_pub,
        Reader(run_cfg.kafka, broker, decode_sample, dead_letter=(dl_pub, dlq)) as reader,
    ):
        reader.assign(topic)
        got: list[Record] = []
        deadline = time.monotonic() + 10.0
        while (not got or not reader.dead_lettered) and time.monotonic() < deadline:
            got += reader.poll(0.1)
        [rec] = got
        assert reader.dead_lettered == 1
    assert rec.value == good and rec.value.trajectories[0].response_ids.dtype == np.int32
    with Reader(run_cfg.kafka, broker, raw_decode) as dl_reader:
        dl_reader.assign(dlq)
        [dead] = _poll_n(dl_reader, 1)
    assert dead.key == "bad" and dead.value == bad
    assert dead.headers["error"] == b"sample/5: response_ids holds 1 null value(s)"


def test_consumer_group_gets_messages_quickly(run_cfg: RunConfig, broker: str) -> None:
    topic = run_cfg.topic("prompts")
    n_parts = run_cfg.kafka.topics.partitions["prompts"]
    with Publisher(run_cfg.kafka, broker) as pub:
        for i in range(8):
            pub.publish(topic, f"p{i}", str(i).encode())

    assigned: list[list[tuple[str, int]]] = []
    t0 = time.monotonic()
    with Reader(run_cfg.kafka, broker, raw_decode, group_id=f"{run_cfg.run_id}-g") as reader:
        reader.subscribe([topic], on_assign=assigned.append)
        got = _poll_n(reader, 8, timeout=10.0)
        elapsed = time.monotonic() - t0
        assert sorted(r.value for r in got) == [str(i).encode() for i in range(8)], elapsed
        assert [sorted(a) for a in assigned] == [[(topic, p) for p in range(n_parts)]]

        next_offsets = {(r.topic, r.partition): r.offset + 1 for r in got}
        reader.commit(next_offsets)
        assert reader.committed(list(next_offsets)) == next_offsets
    assert elapsed < 10.0


def test_a_reader_released_without_leaving_is_dropped_at_its_session_timeout(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """``Reader.close(leave_group=False)`` sends no LeaveGroup (on Tansu one can wedge a
    forming group): the group moves the member's partitions only once its session has timed
    out, as for a crashed member, and nothing waits on the release."""
    cfg = make_run_cfg("kafka.topics.partitions.prompts=2")
    topic, group = cfg.topic("prompts"), f"{cfg.run_id}-g"
    owned: list[set[int]] = [set(), set()]
    readers = [Reader(cfg.kafka, broker, raw_decode, group_id=group, watch_group=True)]
    readers.append(Reader(cfg.kafka, broker, raw_decode, group_id=group, watch_group=True))
    for mine, reader in zip(owned, readers, strict=True):
        reader.subscribe(
            [topic],
            on_assign=lambda parts, mine=mine: mine.update(p for _t, p in parts),
            on_revoke=lambda parts, mine=mine: mine.difference_update(p for _t, p in parts),
        )

    def poll_until(done: Callable[[], bool], *polled: Reader) -> None:
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            for r in polled:
                r.poll(0.05)

    watches = [r.group for r in readers]
    poll_until(lambda: all(owned) and all(w is not None and w.quiet() for w in watches), *readers)
    assert owned[0] | owned[1] == {0, 1} and owned[0] and owned[1]
    released_at = time.monotonic()
    readers[0].close(leave_group=False)
    assert time.monotonic() - released_at < 1.0  # no close sequence to wait for
    poll_until(lambda: owned[1] == {0, 1}, readers[1])
    moved_after = time.monotonic() - released_at
    took_over = set(owned[1])
    readers[1].close()  # (revokes what it owns)
    assert took_over == {0, 1}
    assert cfg.kafka.session_timeout_ms is not None
    assert moved_after >= cfg.kafka.session_timeout_ms / 1000, "it left with a LeaveGroup"


def test_a_reader_whose_prefetch_queue_filled_reads_on_without_a_pause(
    run_cfg: RunConfig, broker: str
) -> None:
    """A trainer busy updating lets large groups pile up in its consumer's prefetch queue
    (``queued.max.messages.kbytes``, 64 MB by default: ~50 groups of 16 x 8K tokens), while
    the workers publish more. Once the queue was over its limit, librdkafka's default
    (``fetch.queue.backoff.ms``) held the next fetch back for 1 s, so after draining the
    queue the trainer waited for the groups published meanwhile: reading a burst ran at half
    the broker's rate (bench transport). Here the limit is 64 KB; five times, 200 KB arrive
    and fill it during an update, and 200 KB more are published before the next read."""
    run_cfg.kafka.extra = {"queued.max.messages.kbytes": 64}
    topic = run_cfg.topic("samples")
    reading, got, sent = 0.0, 0, 0
    with (
        Publisher(run_cfg.kafka, broker) as pub,
        Reader(run_cfg.kafka, broker, raw_decode) as reader,
    ):

        def publish(k: int) -> int:
            for i in range(k):
                pub.publish(topic, str(sent + i), b"x" * 20_000)
            pub.flush()
            return k

        reader.assign(topic)
        for _ in range(5):
            sent += publish(10)
            time.sleep(0.2)  # an update: the reader's prefetch fills past its limit
            sent += publish(10)  # the workers go on
            t0 = time.monotonic()
            step = _poll_n(reader, sent - got, timeout=5.0)
            reading += time.monotonic() - t0
            got += len(step)
            assert got == sent, f"{got} of {sent} messages within 5 s"
    assert reading < 1.5, f"reading {sent} messages took {reading:.1f} s besides the updates"


def test_watermarks_of_several_topics_at_once_are_each_topics_exact_ends(run_cfg, broker):
    """One side consumer for all topics (the log archiver's last read of a run) gives what one
    per topic gives, ends corrected past the last batch (Tansu's high watermark is the last
    batch's base offset + 1: records published together end up in one batch)."""
    samples, steps = run_cfg.topic("samples"), run_cfg.topic("steps")
    with Publisher(run_cfg.kafka, broker) as pub:
        for i in range(40):  # keyed over the partitions; linger batches them
            pub.publish(samples, f"s{i}", b"x")
        for i in range(5):
            pub.publish(steps, str(i), b"y")
    conf = consumer_config(run_cfg.kafka, broker, None)
    together = read_topics_watermarks(conf, [samples, steps])
    apart = {(t, p): m for t in (samples, steps) for p, m in read_watermarks(conf, t).items()}
    assert together == apart
    assert sum(high - low for (t, _), (low, high) in together.items() if t == samples) == 40
    assert sum(high - low for (t, _), (low, high) in together.items() if t == steps) == 5
    assert {t for t, _ in together} == {samples, steps}


def test_a_topic_the_broker_lacks_is_one_line_naming_it_and_the_run(
    run_cfg: RunConfig, broker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run_id with no topics on the broker: UnknownTopic (still the KafkaException code
    callers test), and through the CLI one line, not librdkafka's nested error text."""
    from confluent_kafka import KafkaError

    from asyncrl.cli import main

    with Reader(run_cfg.kafka, broker, raw_decode) as reader, pytest.raises(UnknownTopic) as exc:
        reader.partitions("nosuchrun.samples")
    assert exc.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert str(exc.value) == (
        f"no topic nosuchrun.samples on the broker at {broker}: no run 'nosuchrun' there "
        "(check run_id), or its topics were never created on this broker"
    )
    command = ["inspect", "samples", "run_id=nosuchrun", f"kafka.bootstrap_servers='{broker}'"]
    assert main(command) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("asyncrl inspect: no topic nosuchrun.") and "Traceback" not in err


def test_a_topic_the_broker_lost_is_not_made_again_and_stops_the_role_naming_it(
    make_run_cfg: Callable[..., RunConfig], broker: str
) -> None:
    """A broker restarted without the run's topics (``asyncrl broker`` keeps them in memory):
    a role's producer had the broker make its topic again, with Tansu's default 4 partitions
    (the run's control topic has 1), and a worker's group consumer ended in librdkafka's
    traceback. Now nothing is made, and each client stops on one line naming the topic."""
    # librdkafka waits topic.metadata.propagation.max.ms (30 s) before calling a topic missing
    cfg = make_run_cfg("kafka.extra={topic.metadata.propagation.max.ms: 500}", create_topics=False)
    control = cfg.topic("control")
    pub = Publisher(cfg.kafka, broker)
    pub.publish(control, "k", b"x")
    with pytest.raises(UnknownTopic) as exc:
        pub.flush(10)
    assert control not in _topic_partitions(broker)
    assert str(exc.value).startswith(f"topic {control} is gone from the broker at {broker} ")
    pub = Publisher(cfg.kafka, broker)  # librdkafka knows it is missing: produce() raises
    pub.publish(control, "k", b"x")
    with pytest.raises(UnknownTopic, match=f"^topic {control} is gone"):
        for _ in range(20):
            pub.publish(control, "k", b"x")
            pub.flush(1)

    samples = cfg.topic("samples")
    with Reader(cfg.kafka, broker, raw_decode, group_id=f"{cfg.run_id}-g") as reader:
        reader.subscribe([samples])
        with pytest.raises(UnknownTopic, match=f"^topic {samples} is gone from the broker"):
            for _ in range(20):
                reader.poll(0.5)
    assert samples not in _topic_partitions(broker)


def test_a_commit_the_restarted_broker_refuses_names_the_topic_it_lost(tmp_path) -> None:
    """``asyncrl train`` role by role, SIGTERMed after its ``asyncrl broker`` was restarted
    (topics gone): its last checkpoint's offset commit ended in a KafkaException traceback
    ("Commit failed: Broker: Unknown topic or partition"); now one line naming the topic."""
    from asyncrl.config import load_config
    from asyncrl.launch.broker import EmbeddedBroker

    first = EmbeddedBroker()
    bootstrap = first.start()
    cfg = load_config(
        overrides=[f"kafka.bootstrap_servers='{bootstrap}'", f"output_dir='{tmp_path}'"]
    )
    create_run_topics(cfg, bootstrap)
    samples = cfg.topic("samples")
    with Publisher(cfg.kafka, bootstrap) as pub:
        pub.publish(samples, "k", b"x")
        pub.flush(10)
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}-trainer") as reader:
        reader.assign(samples)
        assert len(_poll_n(reader, 1)) == 1
        first.stop()
        with EmbeddedBroker(port=first.port), pytest.raises(UnknownTopic) as exc:
            reader.commit({(samples, 0): 1})
    assert str(exc.value).startswith(f"topic {samples} is gone from the broker at {bootstrap} ")
