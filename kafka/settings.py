"""Our Kafka config mapped to librdkafka's keys, in exactly one place (each non-default explained)."""

from __future__ import annotations

import logging
import os
import re
import uuid
from typing import TYPE_CHECKING, Any

from asyncrl.config.kafka import EXTERNAL_SESSION_TIMEOUT_MS

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig


log = logging.getLogger(__name__)


_HEADROOM = 1024 * 1024
"""Bytes above kafka.max_message_bytes for batch/record framing in librdkafka's own limits."""


FETCH_QUEUE_BACKOFF_MS = 10
"""How soon a consumer whose prefetch queue was full fetches again (``consumer_config``)."""

BACKGROUND_FETCH_WAIT_MS = 100
"""``fetch.wait.max.ms`` of a reader off the training's critical path (``consumer_config``'s
``background``: the launcher's progress and log archive). Tansu answers an idle fetch only at
its deadline, so an idle consumer costs it a request every ``kafka.fetch_wait_max_ms``:
measured, ~6% of a core per consumer at 20 ms, ~2% at 100."""

_LIBRDKAFKA_FETCH_MAX_DEFAULT = 52_428_800
_LIBRDKAFKA_RECEIVE_MAX_DEFAULT = 100_000_000


def _fetch_max_bytes(kafka_cfg: KafkaConfig) -> int:
    return max(_LIBRDKAFKA_FETCH_MAX_DEFAULT, kafka_cfg.max_message_bytes + _HEADROOM)


def client_config(kafka_cfg: KafkaConfig, bootstrap: str) -> dict[str, Any]:
    """Settings shared by every client; ``kafka.extra`` is applied last and wins."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "message.max.bytes": kafka_cfg.max_message_bytes + _HEADROOM,
        # librdkafka requires receive.message.max.bytes >= fetch.max.bytes + 512.
        "receive.message.max.bytes": max(
            _LIBRDKAFKA_RECEIVE_MAX_DEFAULT, _fetch_max_bytes(kafka_cfg) + _HEADROOM
        ),
        # A broker closing an idle connection is routine (connections.max.idle.ms), not news;
        # a connection that cannot be re-established is still logged and tracked.
        "log.connection.close": False,
    }
    conf.update(security_settings(kafka_cfg))
    conf.update(kafka_cfg.extra)
    return conf


class MissingSecret(RuntimeError):
    """A security setting names an environment variable that is not set."""


def security_settings(kafka_cfg: KafkaConfig) -> dict[str, Any]:
    """librdkafka's TLS/SASL keys from ``kafka.security``; secrets read from the environment.

    The returned dict holds the password: never log it (``redacted`` is for display).
    """
    sec = kafka_cfg.security
    conf: dict[str, Any] = {"security.protocol": sec.protocol}
    if sec.protocol.startswith("SASL_"):
        password = os.environ.get(sec.sasl_password_env)
        if password is None:
            raise MissingSecret(
                f"kafka.security.sasl_password_env: environment variable "
                f"{sec.sasl_password_env} (the SASL password) is not set"
            )
        conf.update(
            {
                "sasl.mechanism": sec.sasl_mechanism,
                "sasl.username": sec.sasl_username,
                "sasl.password": password,
            }
        )
    if sec.protocol.endswith("SSL"):
        for key, value in (
            ("ssl.ca.location", sec.ssl_ca_location),
            ("ssl.certificate.location", sec.ssl_certificate_location),
            ("ssl.key.location", sec.ssl_key_location),
        ):
            if value:
                conf[key] = value
        key_password = os.environ.get(sec.ssl_key_password_env)
        if key_password is not None:
            conf["ssl.key.password"] = key_password
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if sec.ssl_verify_hostname else "none"
        )
    return conf


def redacted(conf: dict[str, Any]) -> dict[str, Any]:
    """A client config safe to print: secret values replaced."""
    return {
        k: ("***" if k in ("sasl.password", "ssl.key.password") else v) for k, v in conf.items()
    }


def producer_config(kafka_cfg: KafkaConfig, bootstrap: str) -> dict[str, Any]:
    """Idempotent, fully acknowledged, uncompressed (payloads are Arrow, mostly incompressible)."""
    conf = {
        "linger.ms": kafka_cfg.linger_ms,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "none",
        # Same key -> same partition as the Java client and aiokafka.
        "partitioner": "murmur2_random",
        # A topic the broker lacks (restarted without the run's topics, another broker) is an
        # error naming it, not a topic the broker makes with its own partition count (Tansu:
        # 4) that the run's partitioning never meant; librdkafka's producer default asks it to.
        "allow.auto.create.topics": False,
    }
    conf.update(client_config(kafka_cfg, bootstrap))
    return conf


def consumer_config(
    kafka_cfg: KafkaConfig, bootstrap: str, group_id: str | None, background: bool = False
) -> dict[str, Any]:
    """Manual commits, classic group protocol with short timeouts (Tansu joins in about half
    the session timeout: see ``KafkaConfig.session_timeout_ms``). ``background``: a reader
    whose latency nobody waits on, which may wait longer per fetch
    (``BACKGROUND_FETCH_WAIT_MS``) and so costs the broker fewer idle requests."""
    fetch_max = _fetch_max_bytes(kafka_cfg)
    conf = {
        "group.id": group_id or f"asyncrl-assign-{uuid.uuid4().hex[:12]}",
        "session.timeout.ms": kafka_cfg.session_timeout_ms or EXTERNAL_SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": kafka_cfg.heartbeat_interval_ms,
        "max.poll.interval.ms": kafka_cfg.max_poll_interval_ms,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": fetch_max,
        "max.partition.fetch.bytes": kafka_cfg.max_message_bytes + _HEADROOM,
        "allow.auto.create.topics": False,
        # Tansu answers a waiting fetch only at its deadline (so this bounds each hop), and
        # metadata/offset requests queue behind it: 500 ms (the default) made each
        # assign()/seek-like call take ~0.5 s.
        "fetch.wait.max.ms": max(kafka_cfg.fetch_wait_max_ms, BACKGROUND_FETCH_WAIT_MS)
        if background
        else kafka_cfg.fetch_wait_max_ms,
        # Once a partition's prefetched messages pass queued.max.messages.kbytes (64 MB), the
        # next fetch waits this long after the application drains them (librdkafka: 1000 ms).
        # A trainer busy updating while large groups arrive fills 64 MB in ~50 groups of 16 x
        # 8K tokens, then read at half the broker's rate (bench transport: 130 vs 260 MB/s).
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        # A member joining or leaving moves only the partitions that must move; the others'
        # owners keep generating through the rebalance (eager protocols revoke everything).
        "partition.assignment.strategy": "cooperative-sticky",
    }
    conf.update(client_config(kafka_cfg, bootstrap))
    return conf


_OUR_KEYS = {
    "linger.ms": "kafka.linger_ms",
    "queue.buffering.max.ms": "kafka.linger_ms",
    "heartbeat.interval.ms": "kafka.heartbeat_interval_ms",
    "session.timeout.ms": "kafka.session_timeout_ms",
    "max.poll.interval.ms": "kafka.max_poll_interval_ms",
    "fetch.wait.max.ms": "kafka.fetch_wait_max_ms",
    "message.max.bytes": "kafka.max_message_bytes",
    "receive.message.max.bytes": "kafka.max_message_bytes",
    "fetch.max.bytes": "kafka.max_message_bytes",
    "max.partition.fetch.bytes": "kafka.max_message_bytes",
}
"""librdkafka's property -> the kafka.* key it is made from (``kafka.extra`` wins, as it does
in the client configs)."""


def client_settings_problem(kafka_cfg: KafkaConfig) -> tuple[str, str] | None:
    """(the key to blame, librdkafka's objection) if a producer or consumer could not be made
    with these settings (an unknown property in ``kafka.extra``, a value out of librdkafka's
    range, two that contradict each other), else None. Made and closed without connecting:
    every role failed at its first client with a traceback naming librdkafka's property."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

    quiet = logging.getLogger("asyncrl.kafka.settings.check")
    quiet.propagate, quiet.disabled = False, True
    # Nothing to connect to: the clients are only made, and destroyed at once.
    made = [
        (Producer, producer_config(kafka_cfg, "")),
        (Consumer, consumer_config(kafka_cfg, "", "asyncrl-settings-check")),
    ]
    for kind, conf in made:
        conf["logger"] = quiet
        try:
            client = kind(conf)
        except (KafkaException, ValueError, TypeError) as err:
            first = err.args[0] if err.args else err
            text = first.str() if isinstance(first, KafkaError) else str(first)
            text = " ".join(text.split())
            return _blamed_key(kafka_cfg, text), text
        if isinstance(client, Consumer):
            client.close()
    return None


def _blamed_key(kafka_cfg: KafkaConfig, text: str) -> str:
    """The key a user sets to change the property librdkafka names (quoted, in its message)."""
    for prop in re.findall(r'[`"]([A-Za-z0-9_.]+)[`"]', text):
        if prop in kafka_cfg.extra:
            return f"kafka.extra.{prop}"
        if prop in _OUR_KEYS:
            return _OUR_KEYS[prop]
    return "kafka.extra"
