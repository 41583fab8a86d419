"""Where a topic's partitions begin and end, exactly (Tansu's high watermark is corrected by
reading the last batch to partition EOF), from a short-lived side consumer."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from asyncrl.kafka.health import (
    _CONNECTION_ERRORS,
    _METADATA_TIMEOUT_S,
    BrokerUnavailable,
    UnknownTopic,
    _BrokerHealth,
    _LibrdkafkaLog,
    _RateLimitedLog,
)
from asyncrl.kafka.settings import consumer_config

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig


log = logging.getLogger(__name__)


def _side_consumer(conf: dict[str, Any]) -> Consumer:
    """A short-lived, assign-only consumer: its own connection, so its requests never queue
    behind a long-polling fetch of the caller's consumer (~0.5 s each, measured on Tansu)."""
    side_conf = dict(conf)
    side_conf.update(
        {
            "group.id": f"asyncrl-watermarks-{uuid.uuid4().hex[:12]}",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "logger": _LibrdkafkaLog(_RateLimitedLog(log), verbose="debug" in conf),
        }
    )
    return Consumer(side_conf)


def _topic_partitions(
    consumer: Consumer,
    topic: str,
    bootstrap: str,
    timeout: float = _METADATA_TIMEOUT_S,
    health: _BrokerHealth | None = None,
) -> list[int]:
    try:
        md = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as err:
        if err.args[0].code() in _CONNECTION_ERRORS:
            reason = err.args[0].str()
            if health is not None and health.last_error:
                reason = health.last_error
            raise BrokerUnavailable(bootstrap, timeout, reason) from None
        raise
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None:
        raise UnknownTopic(topic, bootstrap, tmd.error if tmd is not None else "not in metadata")
    return sorted(tmd.partitions)


def read_watermarks(
    conf: dict[str, Any],
    topic: str,
    exact: bool = True,
    metadata_timeout: float = _METADATA_TIMEOUT_S,
) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}``; with ``exact``, each partition's last batch (from
    high - 1) is read up to partition EOF, whose offset is the real log end. On Apache Kafka
    this confirms ``high``; on Tansu (high = last batch's base offset + 1) it corrects it.
    BrokerUnavailable if no broker answers the metadata request within ``metadata_timeout``."""
    marks = read_topics_watermarks(conf, [topic], exact, metadata_timeout)
    return {p: mark for (_topic, p), mark in marks.items()}


def read_topics_watermarks(
    conf: dict[str, Any],
    topics: list[str],
    exact: bool = True,
    metadata_timeout: float = _METADATA_TIMEOUT_S,
) -> dict[tuple[str, int], tuple[int, int]]:
    """``read_watermarks`` of several topics at once, ``{(topic, partition): (low, high)}``,
    through one side consumer: each one costs ~0.1 s to start and stop on Tansu, which the
    log archiver's last read of a run's six topics paid six times."""
    side = _side_consumer(conf)
    try:
        marks: dict[tuple[str, int], tuple[int, int]] = {}
        for topic in topics:
            for p in _topic_partitions(side, topic, conf["bootstrap.servers"], metadata_timeout):
                marks[(topic, p)] = side.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=_METADATA_TIMEOUT_S, cached=False
                )
        todo = {tp: high for tp, (low, high) in marks.items() if high > low}
        if not exact or not todo:
            return marks
        ends = dict(todo)
        side.assign([TopicPartition(t, p, high - 1) for (t, p), high in todo.items()])
        pending = set(todo)
        deadline = time.monotonic() + _METADATA_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for msg in side.consume(num_messages=500, timeout=0.05):
                err, name, part, offset = msg.error(), msg.topic(), msg.partition(), msg.offset()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                # a message has all three, and so has a partition's EOF
                assert name is not None and part is not None and offset is not None
                key = (name, part)
                if err is None:
                    ends[key] = max(ends[key], offset + 1)
                else:
                    ends[key] = max(ends[key], offset)
                    pending.discard(key)
        if pending:
            log.warning("watermarks: no end of partition(s) %s seen", sorted(pending))
        return {tp: (low, ends.get(tp, high)) for tp, (low, high) in marks.items()}
    finally:
        side.close()


def count_records(kafka_cfg: KafkaConfig, bootstrap: str, topic: str) -> int:
    """Records currently in ``topic``: the sum over partitions of (exact) high - low watermark."""
    marks = read_watermarks(
        consumer_config(kafka_cfg, bootstrap, None),
        topic,
        metadata_timeout=kafka_cfg.broker_down_timeout_s,
    )
    return sum(high - low for low, high in marks.values())
