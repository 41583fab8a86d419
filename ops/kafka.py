"""Thin typed wrappers over confluent-kafka: one Publisher, one Reader, one config mapping.

Every process talks to Kafka through these, so our config names map to librdkafka keys in
exactly one place (``client_config`` and friends). The sync ``Producer`` is used on purpose:
headers travel with it, and a delivery error is surfaced at ``flush``. Undecodable messages
never stop a reader: they go to the run's dead-letter topic with the reason attached.

Dead letters and commits, in this order. A bad record's copy is *published* when it is read
(``on_acked`` marks its offset copied); a commit, synchronous or not, is capped at the lowest
offset whose copy is not acknowledged yet, so a crash in between re-reads the bad record
instead of losing it; the acknowledgement then redoes a capped commit up to where it was
asked (a copy whose delivery fails keeps the commit below it for good, and the publisher's
next flush or check raises the failure). Nothing here flushes or polls a producer from inside one of its own delivery callbacks
(the worker commits prompts from the sample's ``on_acked``, and the dead-letter copies travel
on the same producer): librdkafka cannot serve a flush there, it waited 30 s and then failed
or aborted. Only a synchronous commit from ordinary code flushes the copies first.

Faults. A consumer error that librdkafka recovers from by itself (max.poll.interval
exceeded: it rejoins the group on the next poll; transport errors; retriable ones) is logged,
rate-limited, and skipped; only the others raise. librdkafka's own log lines and error
callbacks go through Python logging, at most one line per kind per client every
``_LOG_EVERY_S`` (it wrote one "Connection refused" line per reconnect, ~20 a second, to
stderr). When every broker stays unreachable longer than ``kafka.broker_down_timeout_s`` (and
a metadata request confirms it), a flush, a poll or a metadata call raises
``BrokerUnavailable``, naming ``kafka.bootstrap_servers``, instead of retrying for minutes.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from asyncrl.ops import tracing
from asyncrl.schemas.codec import DecodeError

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

_HEADROOM = 1024 * 1024
"""Bytes above kafka.max_message_bytes for batch/record framing in librdkafka's own limits."""
_LIBRDKAFKA_FETCH_MAX_DEFAULT = 52_428_800
_LIBRDKAFKA_RECEIVE_MAX_DEFAULT = 100_000_000
_METADATA_TIMEOUT_S = 10.0
HEADER_ERROR = "error"
HEADER_SOURCE_TOPIC = "source-topic"
HEADER_SOURCE_PARTITION = "source-partition"
HEADER_SOURCE_OFFSET = "source-offset"


_LOG_EVERY_S = 10.0
"""A repeated librdkafka log line or client error: at most one per kind per client this often."""
_PROBE_TIMEOUT_S = 2.0
_FLUSH_SLICE_S = 0.5
_CONNECTION_ERRORS = frozenset(
    {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)
"""Errors that mean "maybe no broker is reachable": verified after kafka.broker_down_timeout_s."""
_RECOVERABLE_CONSUMER_ERRORS = _CONNECTION_ERRORS | {
    KafkaError._MAX_POLL_EXCEEDED,  # left the group; the next poll rejoins it
    KafkaError._TIMED_OUT,
}


class KafkaDeliveryError(RuntimeError):
    """A produced message was not acknowledged by the broker."""


class BrokerUnavailable(RuntimeError):
    """No broker of kafka.bootstrap_servers has answered for longer than the bound."""

    def __init__(self, bootstrap: str, down_s: float, reason: str) -> None:
        self.bootstrap, self.down_s = bootstrap, down_s
        reason = " ".join(reason.split())  # one line, whatever librdkafka said
        super().__init__(
            f"no Kafka broker reachable at {bootstrap} (kafka.bootstrap_servers) for "
            f"{down_s:.0f} s: {reason or 'no answer'}; start the broker or fix "
            f"kafka.bootstrap_servers (kafka.broker_down_timeout_s bounds the wait)"
        )


class _RateLimitedLog:
    """Log lines by kind, at most one per kind every ``_LOG_EVERY_S``; the rest are counted and
    the count is appended to the next line of that kind. Thread-safe (callbacks run in
    whichever thread polls the client)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, kind: str, level: int, msg: str, *args: object) -> None:
        if not self._logger.isEnabledFor(level):
            return
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < _LOG_EVERY_S:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            msg, args = msg + " (%d more like it in %.0f s)", (*args, held, now - last)
        self._logger.log(level, msg, *args)


class _LibrdkafkaLog:
    """librdkafka's ``logger``: its lines through Python logging, rate-limited per facility.

    confluent-kafka calls ``log(python_level, "%s [%s] %s", facility, client, text)`` from
    the client's poll. FAIL (a connection failed; librdkafka retries it) is a warning of the
    same kind as ``_BrokerHealth``'s all-brokers-down line, so a client says one of them;
    MAXPOLL is debug, as ``Reader`` says it naming the config key.
    """

    def __init__(self, limiter: _RateLimitedLog) -> None:
        self._limiter = limiter

    def log(self, level: int, fmt: str, *args: object) -> None:
        kind = str(args[0]) if args else ""
        if kind == "FAIL":
            kind, level = "connection", min(level, logging.WARNING)
        elif kind == "MAXPOLL":
            level = logging.DEBUG
        self._limiter.log(kind, level, "librdkafka " + fmt, *args)


class _BrokerHealth:
    """What one client saw of its brokers: since when none may be reachable.

    ``on_error`` is the client's ``error_cb`` (served by its poll/flush); ``check`` raises
    BrokerUnavailable once that lasted ``timeout_s`` and a metadata request fails too.
    librdkafka says when connections fail but not when one succeeds again, so any sign of
    life (a delivery, a message, a probe answered) clears the state.
    """

    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.limiter = _RateLimitedLog(log)
        self.down_since: float | None = None
        self.last_error = ""

    def callbacks(self) -> dict[str, Any]:
        """The client settings that route its errors and log lines here."""
        return {"error_cb": self.on_error, "logger": _LibrdkafkaLog(self.limiter)}

    def on_error(self, err: KafkaError) -> None:
        if err.code() in _CONNECTION_ERRORS:
            if self.down_since is None:
                self.down_since = time.monotonic()
            self.last_error = err.str()
            if err.code() == KafkaError._ALL_BROKERS_DOWN:
                self.limiter.log(
                    "connection",
                    logging.WARNING,
                    "no broker of %s reachable (kafka.bootstrap_servers): %s; retrying for up "
                    "to %.0f s (kafka.broker_down_timeout_s)",
                    self.bootstrap,
                    self.last_error or err.str(),
                    self.timeout_s,
                )
            return  # librdkafka's FAIL log line tells the rest
        level = logging.ERROR if err.fatal() else logging.WARNING
        self.limiter.log(err.name(), level, "kafka client error: %s", err.str())

    def up(self) -> None:
        self.down_since = None

    def check(self, probe: Callable[[float], bool]) -> None:
        """Raise BrokerUnavailable if the brokers have been down for longer than the bound.

        ``probe(timeout)`` asks a broker for metadata: True if one answered. Call it from
        ordinary code only, never from a client callback.
        """
        since = self.down_since
        if since is None or time.monotonic() - since < self.timeout_s:
            return
        if probe(_PROBE_TIMEOUT_S):
            self.down_since = None
            return
        raise BrokerUnavailable(self.bootstrap, time.monotonic() - since, self.last_error)


def _metadata_answers(client: Producer | Consumer, timeout: float) -> bool:
    try:
        client.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


class MessageTooLarge(ValueError):
    """A message above kafka.max_message_bytes, refused before it reaches the broker."""

    def __init__(self, topic: str, key: str | None, size: int, limit: int) -> None:
        self.topic, self.key, self.size, self.limit = topic, key, size, limit
        super().__init__(
            f"message for topic {topic!r} (key {key!r}) is {size} bytes, above "
            f"kafka.max_message_bytes={limit}; raise kafka.max_message_bytes or send less"
        )


# --- config mapping ---------------------------------------------------------------------------
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
    }
    conf.update(client_config(kafka_cfg, bootstrap))
    return conf


def consumer_config(kafka_cfg: KafkaConfig, bootstrap: str, group_id: str | None) -> dict[str, Any]:
    """Manual commits, classic group protocol with short timeouts (Tansu joins in ~3 s)."""
    fetch_max = _fetch_max_bytes(kafka_cfg)
    conf = {
        "group.id": group_id or f"asyncrl-assign-{uuid.uuid4().hex[:12]}",
        "session.timeout.ms": kafka_cfg.session_timeout_ms,
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
        "fetch.wait.max.ms": kafka_cfg.fetch_wait_max_ms,
        # A member joining or leaving moves only the partitions that must move; the others'
        # owners keep generating through the rebalance (eager protocols revoke everything).
        "partition.assignment.strategy": "cooperative-sticky",
    }
    conf.update(client_config(kafka_cfg, bootstrap))
    return conf


# --- records ----------------------------------------------------------------------------------
@dataclass
class Record(Generic[T]):
    """One decoded message with its coordinates (commit ``offset + 1`` to move past it)."""

    topic: str
    partition: int
    offset: int
    key: str | None
    timestamp_ms: int
    headers: dict[str, bytes]
    value: T


def _headers_dict(msg: Message) -> dict[str, bytes]:
    return {k: (v if v is not None else b"") for k, v in (msg.headers() or [])}


def _message_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    size = len(key or b"") + len(value or b"")
    return size + sum(len(k.encode()) + len(v) for k, v in headers)


# --- producing --------------------------------------------------------------------------------
class Publisher:
    """Wraps ``confluent_kafka.Producer``: size-checked produce, errors raised at flush."""

    def __init__(self, kafka_cfg: KafkaConfig, bootstrap: str) -> None:
        self.max_message_bytes = kafka_cfg.max_message_bytes
        self._health = _BrokerHealth(bootstrap, kafka_cfg.broker_down_timeout_s)
        conf = producer_config(kafka_cfg, bootstrap)
        conf.update(self._health.callbacks())
        self._producer = Producer(conf)
        self._error: KafkaError | None = None
        self._error_topic: str | None = None
        self._local = threading.local()  # .depth: delivery callbacks running in this thread
        self.delivered = 0

    @property
    def in_delivery_callback(self) -> bool:
        """True inside one of this publisher's ``on_acked`` callbacks (this thread): no
        flush or poll of this publisher can progress there."""
        return getattr(self._local, "depth", 0) > 0

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
            self._health.up()
        elif self._error is None:
            self._error, self._error_topic = err, msg.topic()

    def _not_in_callback(self, what: str) -> None:
        if self.in_delivery_callback:
            raise RuntimeError(
                f"Publisher.{what}() called from inside one of its own delivery callbacks: "
                "it cannot progress there (queue the work and do it after the poll/flush)"
            )

    def publish(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        headers: Mapping[str, str | bytes] | None = None,
        timestamp_ms: int | None = None,
        on_acked: Callable[[], None] | None = None,
    ) -> None:
        """Queue one message (asynchronous); raises MessageTooLarge before anything is sent.

        ``on_acked`` runs (from ``poll``/``flush``) once the broker has acknowledged it; a
        failed delivery is raised by the next ``flush`` or ``check``.
        """
        key_b = key.encode() if key is not None else None
        span = _send_span(topic, key) if tracing.active() else None
        if span is not None:
            headers = dict(headers or {})
            tracing.inject_headers(headers, span)  # the consumer links to this send
        hdrs = [
            (k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in (headers or {}).items()
        ]
        size = _message_size(key_b, value, hdrs)
        if size > self.max_message_bytes:
            if span is not None:
                span.end()
            raise MessageTooLarge(topic, key, size, self.max_message_bytes)
        callback = self._on_delivery
        if on_acked is not None or span is not None:

            def callback(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                if span is not None:
                    _end_send_span(span, err, msg)
                if err is None and on_acked is not None:
                    self._local.depth = getattr(self._local, "depth", 0) + 1
                    try:
                        on_acked()
                    finally:
                        self._local.depth -= 1

        kwargs: dict[str, Any] = {"headers": hdrs, "on_delivery": callback}
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        while True:
            try:
                self._producer.produce(topic, value=value, key=key_b, **kwargs)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                self._producer.poll(0.1)
                if not self.in_delivery_callback:
                    self.check()
        if not self.in_delivery_callback:  # never serve callbacks from inside one
            self._producer.poll(0)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        self._not_in_callback("poll")
        return self._producer.poll(timeout)

    def check(self) -> None:
        """Raise KafkaDeliveryError if a delivery has failed (without waiting for the rest),
        or BrokerUnavailable if no broker has answered for kafka.broker_down_timeout_s."""
        if self._error is not None:
            raise KafkaDeliveryError(
                f"delivery to {self._error_topic!r} failed: {self._error.str()}"
            )
        self._health.check(functools.partial(_metadata_answers, self._producer))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every queued message; raise KafkaDeliveryError if any failed or remain,
        BrokerUnavailable as soon as no broker has answered for kafka.broker_down_timeout_s."""
        self._not_in_callback("flush")
        deadline = time.monotonic() + timeout
        while True:
            remaining = self._producer.flush(
                max(0.0, min(_FLUSH_SLICE_S, deadline - time.monotonic()))
            )
            self.check()
            if not remaining:
                return
            if time.monotonic() >= deadline:
                raise KafkaDeliveryError(
                    f"{remaining} message(s) still undelivered after {timeout} s"
                )

    def __len__(self) -> int:
        """Messages queued and not yet acknowledged."""
        return len(self._producer)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.flush()
            return
        try:  # do not mask the exception already on its way out
            self.flush()
        except (KafkaDeliveryError, BrokerUnavailable) as err:
            log.error("flush on error exit: %s", err)


def _send_span(topic: str, key: str | None) -> Span:
    """A ``send <topic>`` PRODUCER span, child of the current span; ended on acknowledgement."""
    return tracing.tracer().start_span(
        f"send {topic}",
        kind=SpanKind.PRODUCER,
        attributes=tracing.messaging_attributes(topic, "send", key),
    )


def _end_send_span(span: Span, err: KafkaError | None, msg: Message) -> None:
    if err is None:
        span.set_attribute("messaging.kafka.offset", msg.offset())
        span.set_attribute("messaging.destination.partition.id", str(msg.partition()))
    else:
        span.set_status(Status(StatusCode.ERROR, err.str()))
    span.end()


# --- consuming --------------------------------------------------------------------------------
Decoder = Callable[[bytes | None, dict[str, bytes]], T]
PartitionsCallback = Callable[[list[tuple[str, int]]], None]


class Reader(Generic[T]):
    """Wraps ``confluent_kafka.Consumer``: decoded records, dead-lettering, explicit commits.

    ``decode(value, headers)`` must raise ``DecodeError`` for bad input; such a message is
    copied to the dead-letter topic (original key, value, headers plus error/source headers)
    and skipped; commits stay below it until the copy is acknowledged (see the module doc).
    Any other exception from ``decode`` is a bug and propagates.
    """

    def __init__(
        self,
        kafka_cfg: KafkaConfig,
        bootstrap: str,
        decode: Decoder[T],
        group_id: str | None = None,
        dead_letter: tuple[Publisher, str] | None = None,
    ) -> None:
        self.group_id = group_id
        self._decode = decode
        self._dead_letter = dead_letter
        self._conf = consumer_config(kafka_cfg, bootstrap, group_id)
        self._health = _BrokerHealth(bootstrap, kafka_cfg.broker_down_timeout_s)
        self._max_poll_interval_ms = kafka_cfg.max_poll_interval_ms
        self._consumer = Consumer({**self._conf, **self._health.callbacks()})
        self._closed = False
        self._dl_lock = threading.Lock()
        self._dl_pending: dict[tuple[str, int], set[int]] = {}
        """Offsets whose dead-letter copy is published but not acknowledged yet."""
        self._capped: dict[tuple[str, int], int] = {}
        """Commits held below a pending copy: the offset asked for, redone on its ack."""
        self.dead_lettered = 0
        """Undecodable messages copied to the dead-letter topic."""
        self.dropped = 0
        """Undecodable messages skipped because no dead-letter topic was given."""

    # --- assignment ---------------------------------------------------------------------------
    def subscribe(
        self,
        topics: Iterable[str],
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
        on_lost: PartitionsCallback | None = None,
    ) -> None:
        """Join the consumer group; callbacks get ``[(topic, partition), ...]``.

        The group is cooperative: ``on_assign``/``on_revoke`` get only the partitions that
        move, and ``on_revoke`` runs before they are released, so it may still commit them.
        ``on_lost`` (default: ``on_revoke``): they were taken away already (session expired).
        """
        if self.group_id is None:
            log.warning("subscribe() without group_id: using a throwaway consumer group")

        def wrap(
            cb: PartitionsCallback | None, leaving: bool = False
        ) -> Callable[[Consumer, list[TopicPartition]], None]:
            def handler(_consumer: Consumer, parts: list[TopicPartition]) -> None:
                moving = [(tp.topic, tp.partition) for tp in parts]
                if cb is not None:
                    cb(moving)
                if leaving:  # a capped commit must not be redone for partitions now elsewhere
                    with self._dl_lock:
                        for tp in moving:
                            self._capped.pop(tp, None)

            return handler

        self._consumer.subscribe(
            list(topics),
            on_assign=wrap(on_assign),
            on_revoke=wrap(on_revoke, leaving=True),
            on_lost=wrap(on_lost or on_revoke, leaving=True),
        )

    def partitions(self, topic: str) -> list[int]:
        """Partition ids of ``topic``; raises KafkaException if it does not exist,
        BrokerUnavailable if no broker answers within kafka.broker_down_timeout_s."""
        return _topic_partitions(
            self._consumer,
            topic,
            self._health.bootstrap,
            min(_METADATA_TIMEOUT_S, self._health.timeout_s),
            self._health,
        )

    def assign(self, topic: str, offsets: Mapping[int, int] | None = None) -> None:
        """Read every partition of ``topic`` (no group); start at ``offsets[p]`` or the beginning.

        Adds to the current assignment, replacing any earlier assignment of the same topic.
        """
        offsets = offsets or {}
        wanted = [
            TopicPartition(topic, p, offsets.get(p, OFFSET_BEGINNING))
            for p in self.partitions(topic)
        ]
        unknown = set(offsets) - {tp.partition for tp in wanted}
        if unknown:
            raise ValueError(f"topic {topic!r} has no partition(s) {sorted(unknown)}")
        current = [tp for tp in self._consumer.assignment() if tp.topic == topic]
        if current:
            self._consumer.incremental_unassign(current)
        self._consumer.incremental_assign(wanted)

    def offsets_for_time(self, topic: str, timestamp_ms: int) -> dict[int, int | None]:
        """``{partition: offset}`` to start reading at ``timestamp_ms`` (None: nothing that late).

        A broker may answer the base offset of the record *batch* holding the first record at
        or after the time (Tansu does), so readers must still skip earlier records themselves.
        """
        parts = [TopicPartition(topic, p, timestamp_ms) for p in self.partitions(topic)]
        found = self._consumer.offsets_for_times(parts, timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}

    def end_offsets(self, topic: str, timeout: float = 5.0, ask: bool = True) -> dict[int, int]:
        """``{partition: high watermark}`` of the assigned partitions of ``topic`` (the offset
        the next message will get); raises KafkaException on an error, TimeoutError if the
        broker does not answer within ``timeout``.

        The larger of the broker's answer and the watermark of the last fetch response: Tansu
        answers ListOffsets(latest) with the base offset of the last record *batch* + 1, short
        of the end when a batch holds several records, while its fetch responses are right
        (a Kafka broker is right both ways; the fetch's may lag by one fetch). ``ask=False``:
        the last fetch's alone, without a round trip to the broker (for a per-step metric).
        """
        out = {}
        for t, p in self.assignment():
            if t == topic:
                tp = TopicPartition(t, p)
                fetched = self._consumer.get_watermark_offsets(tp, cached=True)
                if not ask:
                    out[p] = max(fetched[1], 0) if fetched else 0
                    continue
                asked = self._consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                if asked is None:
                    raise TimeoutError(f"no watermark of {t}[{p}] within {timeout} s")
                out[p] = max(asked[1], fetched[1] if fetched else -1)
        return out

    def assignment(self) -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    # --- reading ------------------------------------------------------------------------------
    def poll(self, timeout: float, max_records: int = 500) -> list[Record[T]]:
        """Up to ``max_records`` decoded records, returning as soon as there is one.

        Waits at most ``timeout`` seconds for the first message, then takes what is already
        queued. (``Consumer.consume(n, timeout)`` alone waits the whole ``timeout`` unless
        ``n`` messages arrive.) Errors librdkafka recovers from are logged and skipped (see
        the module doc); BrokerUnavailable once no broker has answered for the bound.
        """
        records: list[Record[T]] = []
        first = self._consumer.poll(timeout)
        messages = [] if first is None else [first]
        if first is not None and max_records > 1:
            messages += self._consumer.consume(num_messages=max_records - 1, timeout=0)
        alive = False
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._consumer_error(err)
                continue
            alive = True
            rec = self._decode_message(msg)
            if rec is not None:
                records.append(rec)
        if alive:
            self._health.up()
        else:
            self._health.check(functools.partial(_metadata_answers, self._consumer))
        return records

    def _consumer_error(self, err: KafkaError) -> None:
        """Skip (and log, rate-limited) what librdkafka recovers from; raise the rest."""
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            return
        if err.fatal() or not (code in _RECOVERABLE_CONSUMER_ERRORS or err.retriable()):
            raise KafkaException(err)
        if code in _CONNECTION_ERRORS:
            self._health.on_error(err)
        elif code == KafkaError._MAX_POLL_EXCEEDED:
            self._health.limiter.log(
                err.name(),
                logging.WARNING,
                "group %s: not polled within kafka.max_poll_interval_ms=%d, so the consumer "
                "left the group; it rejoins now (its partitions were handed back): %s",
                self.group_id,
                self._max_poll_interval_ms,
                err.str(),
            )
        else:
            self._health.limiter.log(
                err.name(), logging.WARNING, "consumer error, retried: %s", err.str()
            )

    def _decode_message(self, msg: Message) -> Record[T] | None:
        headers = _headers_dict(msg)
        raw_key = msg.key()
        try:
            key = raw_key.decode() if raw_key is not None else None
        except UnicodeDecodeError:
            self._reject(msg, headers, DecodeError(f"key is not UTF-8: {raw_key[:32]!r}"))
            return None
        try:
            value = self._decode(msg.value(), headers)
        except DecodeError as err:
            self._reject(msg, headers, err)
            return None
        return Record(
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            key=key,
            timestamp_ms=msg.timestamp()[1],
            headers=headers,
            value=value,
        )

    def _reject(self, msg: Message, headers: dict[str, bytes], err: DecodeError) -> None:
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        if self._dead_letter is None:
            self.dropped += 1
            log.warning("skipping undecodable message %s (no dead-letter topic): %s", where, err)
            return
        publisher, dlq_topic = self._dead_letter
        dl_headers: dict[str, str | bytes] = dict(headers)
        dl_headers.update(
            {
                HEADER_ERROR: str(err),
                HEADER_SOURCE_TOPIC: msg.topic(),
                HEADER_SOURCE_PARTITION: str(msg.partition()),
                HEADER_SOURCE_OFFSET: str(msg.offset()),
            }
        )
        raw_key = msg.key()
        key = raw_key.decode(errors="replace") if raw_key is not None else None
        tp, offset = (msg.topic(), msg.partition()), msg.offset()
        with self._dl_lock:
            self._dl_pending.setdefault(tp, set()).add(offset)
        try:
            publisher.publish(
                dlq_topic,
                key,
                msg.value(),
                headers=dl_headers,
                on_acked=functools.partial(self._dead_letter_acked, tp, offset),
            )
        except BaseException:
            with self._dl_lock:
                self._dl_pending[tp].discard(offset)
            raise
        self.dead_lettered += 1
        log.warning("dead-lettered undecodable message %s -> %s: %s", where, dlq_topic, err)

    def _dead_letter_acked(self, tp: tuple[str, int], offset: int) -> None:
        """``on_acked`` of a dead-letter copy (runs inside the publisher's poll/flush): the
        bad record is safe; redo a commit that was held below it, asynchronously."""
        with self._dl_lock:
            pending = self._dl_pending.get(tp, set())
            pending.discard(offset)
            if not pending:
                self._dl_pending.pop(tp, None)
            wanted = self._capped.get(tp)
            if wanted is None or self._closed:
                return
            if pending and min(pending) < wanted:
                target = min(pending)
            else:
                target = wanted
                del self._capped[tp]
            # under the lock: close() cannot slip in between
            self._consumer.commit(offsets=[TopicPartition(*tp, target)], asynchronous=True)

    def _cap_at_dead_letters(
        self, offsets: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """``offsets`` lowered to the first record whose dead-letter copy is unacknowledged;
        what was asked is kept in ``_capped`` for the acknowledgement to commit."""
        out = {}
        with self._dl_lock:
            for tp, offset in offsets.items():
                pending = self._dl_pending.get(tp)
                cap = min(pending) if pending else None
                if cap is not None and cap < offset:
                    self._capped[tp] = offset
                    out[tp] = cap
                else:
                    self._capped.pop(tp, None)
                    out[tp] = offset
        return out

    # --- offsets ------------------------------------------------------------------------------
    def commit(self, offsets: Mapping[tuple[str, int], int], asynchronous: bool = False) -> None:
        """Commit next-offsets (``record.offset + 1``) for the group; synchronously (errors
        raised) unless ``asynchronous`` (errors logged: for commits a later one supersedes).

        Never past a bad record whose dead-letter copy is not acknowledged (the copy's
        acknowledgement commits the rest). A synchronous commit from ordinary code flushes
        the copies first; an asynchronous one never flushes (it may run inside a delivery
        callback of the dead-letter publisher, where no flush can progress).
        """
        if not offsets:
            return
        if (
            not asynchronous
            and self._dead_letter is not None
            and self._dl_pending
            and not self._dead_letter[0].in_delivery_callback
        ):
            self._dead_letter[0].flush()
        tps = [TopicPartition(t, p, o) for (t, p), o in self._cap_at_dead_letters(offsets).items()]
        if asynchronous:
            self._consumer.commit(offsets=tps, asynchronous=True)
            return
        result = self._consumer.commit(offsets=tps, asynchronous=False) or []
        failed = [tp for tp in result if tp.error is not None]
        if failed:
            raise KafkaException(failed[0].error)

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """The group's committed next-offsets (None where nothing was committed)."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        res = self._consumer.committed(tps, timeout=_METADATA_TIMEOUT_S)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in res}

    def position(self) -> dict[tuple[str, int], int | None]:
        """Next offset to read per assigned partition (None until the first fetch there)."""
        res = self._consumer.position(self._consumer.assignment())
        return {
            (tp.topic, tp.partition): (tp.offset if tp.offset != OFFSET_INVALID else None)
            for tp in res
        }

    def pause_all(self) -> None:
        self._consumer.pause(self._consumer.assignment())

    def resume_all(self) -> None:
        self._consumer.resume(self._consumer.assignment())

    def watermarks(self, topic: str, exact: bool = True) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` fresh from the broker; high is the next offset to write.

        ``exact`` (default) corrects Tansu's ListOffsets, which answers the last *batch*'s base
        offset + 1 as high watermark, by fetching the last batch (~50 ms). Runs on a side
        consumer, so an active fetch of this reader does not delay it.
        """
        return _read_watermarks(
            self._conf, topic, exact, min(_METADATA_TIMEOUT_S, self._health.timeout_s)
        )

    def close(self) -> None:
        """Leave the group and release the client. Idempotent."""
        with self._dl_lock:  # no commit from a late dead-letter acknowledgement after this
            closing, self._closed = not self._closed, True
        if closing:
            self._consumer.close()

    def __enter__(self) -> Reader[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _side_consumer(conf: dict[str, Any]) -> Consumer:
    """A short-lived, assign-only consumer: its own connection, so its requests never queue
    behind a long-polling fetch of the caller's consumer (~0.5 s each, measured on Tansu)."""
    side_conf = dict(conf)
    side_conf.update(
        {
            "group.id": f"asyncrl-watermarks-{uuid.uuid4().hex[:12]}",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "logger": _LibrdkafkaLog(_RateLimitedLog(log)),
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
        err = tmd.error if tmd is not None else "not in metadata"
        raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"{topic}: {err}"))
    return sorted(tmd.partitions)


def _read_watermarks(
    conf: dict[str, Any],
    topic: str,
    exact: bool = True,
    metadata_timeout: float = _METADATA_TIMEOUT_S,
) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}``; with ``exact``, each partition's last batch (from
    high - 1) is read up to partition EOF, whose offset is the real log end. On Apache Kafka
    this confirms ``high``; on Tansu (high = last batch's base offset + 1) it corrects it.
    BrokerUnavailable if no broker answers the metadata request within ``metadata_timeout``."""
    side = _side_consumer(conf)
    try:
        marks = {}
        for p in _topic_partitions(side, topic, conf["bootstrap.servers"], metadata_timeout):
            marks[p] = side.get_watermark_offsets(
                TopicPartition(topic, p), timeout=_METADATA_TIMEOUT_S, cached=False
            )
        todo = {p: high for p, (low, high) in marks.items() if high > low}
        if not exact or not todo:
            return marks
        ends = dict(todo)
        side.assign([TopicPartition(topic, p, high - 1) for p, high in todo.items()])
        pending = set(todo)
        deadline = time.monotonic() + _METADATA_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for msg in side.consume(num_messages=500, timeout=0.05):
                err, p = msg.error(), msg.partition()
                if err is None:
                    ends[p] = max(ends[p], msg.offset() + 1)
                elif err.code() == KafkaError._PARTITION_EOF:
                    ends[p] = max(ends[p], msg.offset())
                    pending.discard(p)
                else:
                    raise KafkaException(err)
        if pending:
            log.warning("watermarks(%s): no end of partition(s) %s seen", topic, sorted(pending))
        return {p: (low, ends.get(p, high)) for p, (low, high) in marks.items()}
    finally:
        side.close()


def client_callbacks(kafka_cfg: KafkaConfig, bootstrap: str) -> dict[str, Any]:
    """``error_cb`` and ``logger`` settings for a raw confluent-kafka client built elsewhere
    (merge them into its config): its librdkafka lines then go through Python logging,
    rate-limited like the Publisher's and Reader's, instead of ~20 stderr lines a second
    while a broker is down."""
    return _BrokerHealth(bootstrap, kafka_cfg.broker_down_timeout_s).callbacks()


def admin_client(kafka_cfg: KafkaConfig, bootstrap: str) -> AdminClient:
    """An AdminClient whose librdkafka lines are rate-limited like the other clients', checked
    to reach a broker first: BrokerUnavailable (naming kafka.bootstrap_servers) if none
    answers a metadata request within kafka.broker_down_timeout_s, rather than an admin
    request's bare ``_TIMED_OUT`` later."""
    health = _BrokerHealth(bootstrap, kafka_cfg.broker_down_timeout_s)
    admin = AdminClient({**client_config(kafka_cfg, bootstrap), **health.callbacks()})
    try:
        admin.list_topics(timeout=health.timeout_s)
    except KafkaException as err:
        if err.args[0].code() not in (*_CONNECTION_ERRORS, KafkaError._TIMED_OUT):
            raise
        admin.poll(0)  # serve the error callbacks: they say why (e.g. connection refused)
        reason = health.last_error or err.args[0].str()
        raise BrokerUnavailable(bootstrap, health.timeout_s, reason) from None
    return admin


def raw_decode(value: bytes | None, headers: dict[str, bytes]) -> bytes | None:
    """Identity decoder, for readers that want the bytes as they are."""
    return value


def count_records(kafka_cfg: KafkaConfig, bootstrap: str, topic: str) -> int:
    """Records currently in ``topic``: the sum over partitions of (exact) high - low watermark."""
    marks = _read_watermarks(
        consumer_config(kafka_cfg, bootstrap, None),
        topic,
        metadata_timeout=min(_METADATA_TIMEOUT_S, kafka_cfg.broker_down_timeout_s),
    )
    return sum(high - low for low, high in marks.values())
