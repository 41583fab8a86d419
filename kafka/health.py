"""Broker health: librdkafka's log lines and errors through Python logging (rate-limited), and
BrokerUnavailable once no broker has answered for ``kafka.broker_down_timeout_s``."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import AdminClient

from asyncrl.kafka.settings import client_config

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig


log = logging.getLogger(__name__)


_METADATA_TIMEOUT_S = 10.0
_LOG_EVERY_S = 10.0
"""A repeated librdkafka log line or client error: at most one per kind per client this often."""


_PROBE_TIMEOUT_S = 2.0
_CONNECTION_ERRORS = frozenset(
    {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)
"""Errors that mean "maybe no broker is reachable": verified after kafka.broker_down_timeout_s."""


_RECOVERABLE_CONSUMER_ERRORS = _CONNECTION_ERRORS | {
    KafkaError._MAX_POLL_EXCEEDED,  # left the group; the next poll rejoins it
    KafkaError._TIMED_OUT,
}


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


UNKNOWN_TOPIC_CODES = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
"""What a client says of a topic the broker lacks (a producer that knew it: its partitions
are gone). The clients never have one made
(``allow.auto.create.topics``), so a running role stops on it, as UnknownTopic."""

_LOST_PARTITION = re.compile(r"^(\S+) \[\d+\]: ")
"""How librdkafka's error callback names the topic of an assigned partition the broker lost
(``run.samples [0]: topic does not exist (Broker: Unknown topic or partition)``)."""


class UnknownTopic(KafkaException):
    """A topic the broker does not have: a run_id that names no run there, or a run whose
    topics were never created on this broker, or (``gone``) one a running role was using and
    the broker lost. Still a KafkaException (code UNKNOWN_TOPIC_OR_PART) for callers that test
    the code; its message is one line."""

    def __init__(
        self, topic: str, bootstrap: str, problem: object = None, gone: bool = False
    ) -> None:
        super().__init__(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"{topic}: {problem}"))
        self.topic, self.bootstrap, self.gone = topic, bootstrap, gone

    def __str__(self) -> str:
        if self.gone:
            return (
                f"topic {self.topic} is gone from the broker at {self.bootstrap} (restarted? "
                "`asyncrl broker` keeps topics in memory only): asyncrl does not let a broker "
                "make it again with its own partition count; start the run on a broker that "
                "holds its topics"
            )
        run = self.topic.rsplit(".", 1)[0]
        return (
            f"no topic {self.topic} on the broker at {self.bootstrap}: no run {run!r} there "
            "(check run_id), or its topics were never created on this broker"
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
            assert last is not None  # lines are held back only after one was logged
            msg, args = msg + " (%d more like it in %.0f s)", (*args, held, now - last)
        self._logger.log(level, msg, *args)


class _LibrdkafkaLog:
    """librdkafka's ``logger``: its lines through Python logging, rate-limited per facility.

    confluent-kafka calls ``log(python_level, "%s [%s] %s", facility, client, text)`` from
    the client's poll. FAIL (a connection failed; librdkafka retries it) is a warning of the
    same kind as ``_BrokerHealth``'s all-brokers-down line, so a client says one of them;
    MAXPOLL is debug, as ``Reader`` says it naming the config key. ``verbose``: the user
    asked for librdkafka's debug lines (``kafka.extra.debug``, e.g. ``cgrp``): every line is
    logged, at INFO at least, so that they show at the default log level.
    """

    def __init__(self, limiter: _RateLimitedLog, verbose: bool = False) -> None:
        self._limiter = limiter
        self.verbose = verbose

    def log(self, level: int, fmt: str, *args: object) -> None:
        if self.verbose:
            log.log(max(level, logging.INFO), "librdkafka " + fmt, *args)
            return
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

    def __init__(self, bootstrap: str, timeout_s: float, verbose: bool = False) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.limiter = _RateLimitedLog(log)
        self.verbose = verbose
        """librdkafka's debug lines were asked for (``_LibrdkafkaLog``)."""
        self.down_since: float | None = None
        self.last_error = ""
        self.lost_topic: tuple[str, str] | None = None
        """(topic, librdkafka's words) of a topic the broker no longer has: for partitions a
        reader assigned itself (no group), the error callback is the only place this shows."""

    @classmethod
    def of(cls, kafka_cfg: KafkaConfig, bootstrap: str) -> _BrokerHealth:
        """The health of a client built from ``kafka_cfg`` (its timeout, its debug lines)."""
        return cls(bootstrap, kafka_cfg.broker_down_timeout_s, "debug" in kafka_cfg.extra)

    def callbacks(self) -> dict[str, Any]:
        """The client settings that route its errors and log lines here."""
        return {"error_cb": self.on_error, "logger": _LibrdkafkaLog(self.limiter, self.verbose)}

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
        if err.code() in UNKNOWN_TOPIC_CODES and self.lost_topic is None:
            named = _LOST_PARTITION.match(err.str())
            self.lost_topic = (named.group(1) if named else "?", err.str())
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


def accepts_connection(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``timeout_s`` (a broker's, or a
    collector's, port is open: cheaper than a protocol request, and all a "gone?" needs)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _metadata_answers(client: Producer | Consumer, timeout: float) -> bool:
    try:
        client.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def client_callbacks(kafka_cfg: KafkaConfig, bootstrap: str) -> dict[str, Any]:
    """``error_cb`` and ``logger`` settings for a raw confluent-kafka client built elsewhere
    (merge them into its config): its librdkafka lines then go through Python logging,
    rate-limited like the Publisher's and Reader's, instead of ~20 stderr lines a second
    while a broker is down."""
    return _BrokerHealth.of(kafka_cfg, bootstrap).callbacks()


def admin_client(kafka_cfg: KafkaConfig, bootstrap: str) -> AdminClient:
    """An AdminClient whose librdkafka lines are rate-limited like the other clients', checked
    to reach a broker first: BrokerUnavailable (naming kafka.bootstrap_servers) if none
    answers a metadata request within kafka.broker_down_timeout_s, rather than an admin
    request's bare ``_TIMED_OUT`` later."""
    health = _BrokerHealth.of(kafka_cfg, bootstrap)
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
