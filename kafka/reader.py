"""Reading: a typed consumer with explicit commits, which dead-letters what it cannot decode and
never commits past a dead letter whose copy is not acknowledged (the order is numbered in
``asyncrl.kafka.dead_letters``)."""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from asyncrl.kafka.dead_letters import DeadLetters
from asyncrl.kafka.group_watch import GroupWatch
from asyncrl.kafka.health import (
    _CONNECTION_ERRORS,
    _METADATA_TIMEOUT_S,
    _RECOVERABLE_CONSUMER_ERRORS,
    UNKNOWN_TOPIC_CODES,
    UnknownTopic,
    _BrokerHealth,
    _metadata_answers,
)
from asyncrl.kafka.publisher import Publisher
from asyncrl.kafka.record import (
    Decoder,
    PartitionsCallback,
    Record,
    T,
)
from asyncrl.kafka.settings import consumer_config
from asyncrl.kafka.watermarks import _topic_partitions, read_watermarks

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig


log = logging.getLogger(__name__)
_NOT_AVAILABLE = re.compile(r"topic not available: ([^:\s]+)")
"""librdkafka's words for a subscribed topic the broker lacks, where the error names no topic."""

RELEASE_WAIT_S = 5.0
"""How long ``Reader.close(leave_group=False)`` waits for the client's release."""

_OPEN: weakref.WeakSet[Reader[Any]] = weakref.WeakSet()
"""This process's Readers not closed yet (``topics_read_here``)."""


def topics_read_here() -> set[str]:
    """Topics an open Reader of this process is subscribed to or assigned: deleting one of
    them under it crashes the process (``asyncrl.kafka.topics.delete_run_topics``)."""
    return {topic for reader in list(_OPEN) for topic in reader.topics}


class Reader(Generic[T]):
    """Wraps ``confluent_kafka.Consumer``: decoded records, dead-lettering, explicit commits.

    ``decode(value, headers)`` must raise ``DecodeError`` for bad input; such a message is
    copied to the dead-letter topic and skipped, and commits stay below it until the copy is
    acknowledged (``asyncrl.kafka.dead_letters``). Any other exception from ``decode`` is a
    bug and propagates.
    """

    def __init__(
        self,
        kafka_cfg: KafkaConfig,
        bootstrap: str,
        decode: Decoder[T],
        group_id: str | None = None,
        dead_letter: tuple[Publisher, str] | None = None,
        watch_group: bool = False,
        background: bool = False,
        skipped_because: str = "no dead-letter topic given",
    ) -> None:
        """``watch_group``: keep this member's join state (``group``), for a member that
        may leave without a LeaveGroup (``close``). ``background``: nobody waits on this
        reader's latency (``consumer_config``). ``skipped_because``: why an undecodable
        message is skipped here when no ``dead_letter`` is given (another reader copies it)."""
        self.group_id = group_id
        self._conf = consumer_config(kafka_cfg, bootstrap, group_id, background)
        self._health = _BrokerHealth.of(kafka_cfg, bootstrap)
        self._max_poll_interval_ms = kafka_cfg.max_poll_interval_ms
        self.group = GroupWatch() if watch_group else None
        watch = self.group.settings() if self.group is not None else {}
        self._consumer = Consumer({**self._conf, **self._health.callbacks(), **watch})
        self.topics: set[str] = set()
        """Topics subscribed to or assigned (until ``close``)."""
        _OPEN.add(self)
        self.dead_letters = DeadLetters(decode, dead_letter, skipped_because, self._commit_later)

    @property
    def dead_lettered(self) -> int:
        """Undecodable messages copied to the dead-letter topic."""
        return self.dead_letters.copied

    @property
    def dropped(self) -> int:
        """Undecodable messages skipped because no dead-letter topic was given."""
        return self.dead_letters.dropped

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

        A partition assigned starts unpaused, as with Kafka's Java client (librdkafka keeps a
        partition's pause across its loss and a later re-assignment to the same consumer).
        """
        if self.group_id is None:
            log.warning("subscribe() without group_id: using a throwaway consumer group")

        def wrap(
            cb: PartitionsCallback | None, leaving: bool = False
        ) -> Callable[[Consumer, list[TopicPartition]], None]:
            def handler(consumer: Consumer, parts: list[TopicPartition]) -> None:
                if not leaving and parts:  # before the library assigns them (after this call)
                    consumer.resume(parts)
                moving = [(tp.topic, tp.partition) for tp in parts]
                if cb is not None:
                    cb(moving)
                if leaving:
                    self.dead_letters.forget(moving)

            return handler

        topics = list(topics)
        self.topics.update(topics)
        self._consumer.subscribe(
            topics,
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
            self._health.timeout_s,
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
        self.topics.add(topic)
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
        the module doc); BrokerUnavailable once no broker has answered for the bound;
        UnknownTopic once the broker has lost a topic this reader reads (a restarted
        ``asyncrl broker``).
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
                self._consumer_error(err, msg.topic())
                continue
            alive = True
            rec = self.dead_letters.record(msg)
            if rec is not None:
                records.append(rec)
        if self._health.lost_topic is not None:
            topic, why = self._health.lost_topic
            raise UnknownTopic(topic, self._health.bootstrap, why, gone=True)
        if alive:
            self._health.up()
        else:
            self._health.check(functools.partial(_metadata_answers, self._consumer))
        return records

    def _consumer_error(self, err: KafkaError, topic: str | None = None) -> None:
        """Skip (and log, rate-limited) what librdkafka recovers from; raise the rest (a topic
        the broker lost as UnknownTopic, one line naming it)."""
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            return
        if code in UNKNOWN_TOPIC_CODES:
            named = topic or _NOT_AVAILABLE.search(err.str())
            name = named if isinstance(named, str) else named.group(1) if named else "?"
            raise UnknownTopic(name, self._health.bootstrap, err.str(), gone=True)
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
        target = self.dead_letters.target
        if (
            not asynchronous
            and target is not None
            and self.dead_letters.pending
            and not target[0].in_delivery_callback
        ):
            target[0].flush()
        tps = [TopicPartition(t, p, o) for (t, p), o in self.dead_letters.cap(offsets).items()]
        if asynchronous:
            self._consumer.commit(offsets=tps, asynchronous=True)
            return
        try:
            result = self._consumer.commit(offsets=tps, asynchronous=False) or []
        except KafkaException as err:
            self._raise_if_lost(err.args[0], tps)
            raise
        failed = [(tp, tp.error) for tp in result if tp.error is not None]
        if failed:
            self._raise_if_lost(failed[0][1], [failed[0][0]])
            raise KafkaException(failed[0][1])

    def _commit_later(self, tp: tuple[str, int], offset: int) -> None:
        """An asynchronous commit of one partition (a dead-letter acknowledgement's)."""
        self._consumer.commit(offsets=[TopicPartition(*tp, offset)], asynchronous=True)

    def _raise_if_lost(self, err: KafkaError, tps: list[TopicPartition]) -> None:
        """A commit the broker refused because it no longer has the topic: UnknownTopic, one
        line naming it, as a poll says it (librdkafka's commit error names no topic)."""
        if err.code() in UNKNOWN_TOPIC_CODES:
            topics = ", ".join(sorted({tp.topic for tp in tps}))
            raise UnknownTopic(topics, self._health.bootstrap, err.str(), gone=True) from None

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
        return read_watermarks(self._conf, topic, exact, self._health.timeout_s)

    def close(self, leave_group: bool = True) -> None:
        """Leave the group and release the client. Idempotent.

        ``leave_group=False``: release the client without a LeaveGroup, as a crashed member
        would; the group drops this member when its session times out. Why: on Tansu a
        member that leaves while the group is forming can wedge it for good, and one that
        times out never does (``prompt_source``'s module doc). Commit first: nothing is.
        Only while the member's own join is quiet (``GroupWatch.quiet``), or the release
        may never return (``kafka.group_watch``)."""
        if not self.dead_letters.close():
            return
        _OPEN.discard(self)
        if leave_group:
            self._consumer.close()
            return
        # confluent-kafka destroys a consumer that was never closed without its close
        # sequence (no LeaveGroup, no rebalance callbacks), as soon as the last reference
        # goes. One held elsewhere would keep heartbeating for a member nobody polls: leave
        # properly then.
        held = [self._consumer]
        del self._consumer  # any use after close fails loudly instead of rejoining
        if sys.getrefcount(held[0]) > 2:  # the list's and getrefcount's argument
            log.warning("consumer still referenced elsewhere: leaving its group instead")
            held.pop().close()
            return
        # Released on a thread, so that a destroy that never returns (kafka.group_watch)
        # is left behind instead of hanging its caller; the process's exit ends it.
        release = threading.Thread(target=held.clear, name="kafka-release", daemon=True)
        release.start()
        release.join(RELEASE_WAIT_S)
        if release.is_alive():
            log.error(
                "releasing a consumer of group %s did not finish in %.0f s: left behind",
                *(self.group_id, RELEASE_WAIT_S),
            )

    def __enter__(self) -> Reader[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
