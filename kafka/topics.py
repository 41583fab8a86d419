"""Create and delete a run's topics explicitly, with the configured partition counts.

Explicit creation matters: Tansu (and many clusters) auto-create missing topics with a
default partition count (4 on Tansu), which would silently change how prompts are sharded.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from asyncrl.config import ConfigError, RunConfig
from asyncrl.kafka.health import admin_client
from asyncrl.kafka.reader import topics_read_here

log = logging.getLogger(__name__)

RUN_TOPICS = ("prompts", "samples", "partials", "control", "steps", "dead-letter")

READ_ORDER = ("steps", "partials", "samples", "prompts", "control", "dead-letter")
"""The order a live run's topics are read in: a step names the samples it trained, a sample
its partial segments and its prompt, and a sample's version is within a budget the control
topic granted before it. Read the other way, topic by topic while the run writes, the log
would show a sample whose version's budget was not there yet: a violation that is not one."""

_VISIBLE_TIMEOUT_S = 15.0
_REQUEST_TIMEOUT_S = 15.0


def _admin(cfg: RunConfig, bootstrap: str) -> AdminClient:
    return admin_client(cfg.kafka, bootstrap)  # BrokerUnavailable if no broker answers


def _partition_counts(cfg: RunConfig) -> dict[str, int]:
    counts = cfg.kafka.topics.partitions
    out = {}
    for name in RUN_TOPICS:
        if name not in counts:
            raise ConfigError(f"kafka.topics.partitions.{name}: missing partition count")
        if counts[name] < 1:
            raise ConfigError(f"kafka.topics.partitions.{name}: must be >= 1, got {counts[name]}")
        out[cfg.topic(name)] = counts[name]
    return out


def create_run_topics(cfg: RunConfig, bootstrap: str) -> list[str]:
    """Create every run topic (existing ones are fine) and wait until metadata shows them."""
    return create_topics(cfg, bootstrap, _partition_counts(cfg))


def create_topics(cfg: RunConfig, bootstrap: str, wanted: dict[str, int]) -> list[str]:
    """Create topics (name -> partitions) with the run's message size limit; wait until visible."""
    admin = _admin(cfg, bootstrap)
    new = [
        NewTopic(
            topic,
            num_partitions=n,
            replication_factor=1,
            config={"max.message.bytes": str(cfg.kafka.max_message_bytes)},
        )
        for topic, n in wanted.items()
    ]
    futures = admin.create_topics(new, request_timeout=_REQUEST_TIMEOUT_S)
    for fut in futures.values():
        try:
            fut.result()
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _wait_visible(admin, wanted)
    return list(wanted)


def _wait_visible(admin: AdminClient, wanted: dict[str, int]) -> None:
    deadline = time.monotonic() + _VISIBLE_TIMEOUT_S
    missing = list(wanted)
    while True:
        topics = admin.list_topics(timeout=_REQUEST_TIMEOUT_S).topics
        missing = [t for t in wanted if t not in topics or topics[t].error is not None]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics not visible in metadata after creation: {missing}")
        time.sleep(0.1)
    for t, n in wanted.items():
        have = len(topics[t].partitions)
        if have != n:
            log.warning(
                "topic %s already exists with %d partitions; config says %d (kept as is)",
                t,
                have,
                n,
            )


def delete_run_topics(cfg: RunConfig, bootstrap: str) -> list[str]:
    """Delete every run topic that exists; returns the names deleted.

    Only once nothing in this process reads them: librdkafka crashes the process (SIGSEGV, no
    traceback) when a topic that one of its consumers is assigned or subscribed to is deleted
    (Tansu 0.6, confluent-kafka 2.16.1, 2026-11-27: assigned and subscribed alike). So
    refused, before the broker is asked, while an open ``Reader`` reads one
    (``topics_read_here``); consumers outside ``Reader`` (the launcher's log archiver, the side
    consumers of ``watermarks``) are not tracked: close them first. No command or run end calls
    it: a run's topics are its log (the embedded broker's go with its process), and ``asyncrl
    run`` moves only a run's directory aside.
    """
    names = [cfg.topic(name) for name in RUN_TOPICS]
    read = sorted(topics_read_here() & set(names))
    if read:
        raise RuntimeError(
            f"not deleting the topics of run {cfg.run_id!r}: {', '.join(read)} still read by "
            "an open Reader in this process; close it first (librdkafka crashes the process "
            "when a topic it reads is deleted)"
        )
    admin = _admin(cfg, bootstrap)
    existing = set(admin.list_topics(timeout=_REQUEST_TIMEOUT_S).topics)
    targets = [t for t in names if t in existing]
    if not targets:
        return []
    deleted = []
    for topic, fut in admin.delete_topics(targets, request_timeout=_REQUEST_TIMEOUT_S).items():
        try:
            fut.result()
            deleted.append(topic)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    return deleted
