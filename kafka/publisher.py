"""Publishing: one synchronous-style Producer per process, delivery errors surfaced at flush."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from asyncrl.kafka.health import (
    UNKNOWN_TOPIC_CODES,
    BrokerUnavailable,
    UnknownTopic,
    _BrokerHealth,
    _metadata_answers,
)
from asyncrl.kafka.settings import producer_config
from asyncrl.telemetry import tracing

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig


log = logging.getLogger(__name__)


_FLUSH_SLICE_S = 0.5


class KafkaDeliveryError(RuntimeError):
    """A produced message was not acknowledged by the broker."""


class MessageTooLarge(ValueError):
    """A message above kafka.max_message_bytes, refused before it reaches the broker."""

    def __init__(self, topic: str, key: str | None, size: int, limit: int) -> None:
        self.topic, self.key, self.size, self.limit = topic, key, size, limit
        super().__init__(
            f"message for topic {topic!r} (key {key!r}) is {size} bytes, above "
            f"kafka.max_message_bytes={limit}; raise kafka.max_message_bytes or send less"
        )


def _message_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    size = len(key or b"") + len(value or b"")
    return size + sum(len(k.encode()) + len(v) for k, v in headers)


class Publisher:
    """Wraps ``confluent_kafka.Producer``: size-checked produce, errors raised at flush."""

    def __init__(self, kafka_cfg: KafkaConfig, bootstrap: str) -> None:
        self.max_message_bytes = kafka_cfg.max_message_bytes
        self._health = _BrokerHealth.of(kafka_cfg, bootstrap)
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
            except KafkaException as err:  # a topic librdkafka already knows the broker lacks
                code = err.args[0].code() if err.args else None
                if code not in UNKNOWN_TOPIC_CODES:
                    raise
                if span is not None:
                    span.end()
                raise UnknownTopic(topic, self._health.bootstrap, err, gone=True) from None
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
        if self._error is not None and self._error.code() in UNKNOWN_TOPIC_CODES:
            assert self._error_topic is not None
            raise UnknownTopic(self._error_topic, self._health.bootstrap, self._error, gone=True)
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
                    f"{remaining} message(s) still undelivered after {timeout} s: the broker at "
                    f"{self._health.bootstrap} answers but does not take them (restarted "
                    "without the run's topics? `asyncrl broker` keeps them in memory only)"
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
