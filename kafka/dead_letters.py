"""A reader's decoding, and the dead-letter copies of what does not decode.

A bad record never stops a reader and is never lost. In this order:

1. A message that does not decode (``DecodeError``, or a key that is not UTF-8) is copied to
   the dead-letter topic when it is read: its key, value and headers, plus the error and its
   source topic, partition and offset. Its offset is then pending.
2. A commit, synchronous or not, is capped at the lowest pending offset of its partition; the
   offset asked for is kept.
3. The copy's acknowledgement (the publisher's ``on_acked``) clears its offset and redoes a
   capped commit, asynchronously, up to the next pending offset or to where it was asked.
   A crash before that re-reads the bad record instead of losing it.
4. A copy whose delivery fails keeps the commit below it for good; the publisher's next flush
   or check raises the failure.
5. Partitions that leave this reader (revoked or lost) forget their capped commits, and once
   the reader is closed no acknowledgement commits.

Nothing here flushes or polls the publisher: step 3 runs inside its delivery callback, where
librdkafka cannot serve a flush. Without a dead-letter topic, a bad message is skipped and
counted (another reader of the topic copies it).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Generic

from confluent_kafka import Message

from asyncrl.kafka.publisher import Publisher
from asyncrl.kafka.record import (
    HEADER_ERROR,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
    Decoder,
    Record,
    T,
    _headers_dict,
    coordinates,
)
from asyncrl.schemas.codec import DecodeError

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class DeadLetters(Generic[T]):
    """Decodes a reader's messages; copies those that do not decode, and caps its commits.

    ``commit(partition, offset)`` commits asynchronously on the reader's consumer (step 3).
    Any exception from ``decode`` other than ``DecodeError`` is a bug and propagates.
    """

    def __init__(
        self,
        decode: Decoder[T],
        target: tuple[Publisher, str] | None,
        skipped_because: str,
        commit: Callable[[Partition, int], None],
    ) -> None:
        self._decode = decode
        self.target = target
        self._skipped_because = skipped_because
        self._commit = commit
        self.lock = threading.Lock()
        self.pending: dict[Partition, set[int]] = {}
        """Offsets whose copy is published but not acknowledged yet."""
        self._capped: dict[Partition, int] = {}
        """Commits held below a pending copy: the offset asked for, redone on its ack."""
        self.closed = False
        self.copied = 0
        """Undecodable messages copied to the dead-letter topic."""
        self.dropped = 0
        """Undecodable messages skipped because no dead-letter topic was given."""

    def record(self, msg: Message) -> Record[T] | None:
        """``msg`` decoded, or None: copied (step 1) or skipped."""
        headers = _headers_dict(msg)
        raw_key = msg.key()
        try:
            key = raw_key.decode() if raw_key is not None else None
        except UnicodeDecodeError:
            assert raw_key is not None
            self._reject(msg, headers, DecodeError(f"key is not UTF-8: {raw_key[:32]!r}"))
            return None
        try:
            value = self._decode(msg.value(), headers)
        except DecodeError as err:
            self._reject(msg, headers, err)
            return None
        topic, partition, offset = coordinates(msg)
        return Record(
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            timestamp_ms=msg.timestamp()[1],
            headers=headers,
            value=value,
        )

    def _reject(self, msg: Message, headers: dict[str, bytes], err: DecodeError) -> None:
        topic, partition, offset = coordinates(msg)
        where = f"{topic}[{partition}]@{offset}"
        if self.target is None:
            self.dropped += 1
            log.warning(
                "skipping undecodable message %s (%s): %s", where, self._skipped_because, err
            )
            return
        publisher, dlq_topic = self.target
        dl_headers: dict[str, str | bytes] = dict(headers)
        dl_headers.update(
            {
                HEADER_ERROR: str(err),
                HEADER_SOURCE_TOPIC: topic,
                HEADER_SOURCE_PARTITION: str(partition),
                HEADER_SOURCE_OFFSET: str(offset),
            }
        )
        raw_key = msg.key()
        key = raw_key.decode(errors="replace") if raw_key is not None else None
        tp = (topic, partition)
        with self.lock:
            self.pending.setdefault(tp, set()).add(offset)
        try:
            publisher.publish(
                dlq_topic,
                key,
                msg.value(),
                headers=dl_headers,
                on_acked=functools.partial(self._acked, tp, offset),
            )
        except BaseException:
            with self.lock:
                self.pending[tp].discard(offset)
            raise
        self.copied += 1
        log.warning("dead-lettered undecodable message %s -> %s: %s", where, dlq_topic, err)

    def _acked(self, tp: Partition, offset: int) -> None:
        """Step 3: the bad record is safe; redo a commit that was held below it."""
        with self.lock:
            pending = self.pending.get(tp, set())
            pending.discard(offset)
            if not pending:
                self.pending.pop(tp, None)
            wanted = self._capped.get(tp)
            if wanted is None or self.closed:
                return
            if pending and min(pending) < wanted:
                target = min(pending)
            else:
                target = wanted
                del self._capped[tp]
            self._commit(tp, target)  # under the lock: close() cannot slip in between

    def cap(self, offsets: Mapping[Partition, int]) -> dict[Partition, int]:
        """Step 2: ``offsets`` lowered to the first record whose copy is unacknowledged; what
        was asked is kept for the acknowledgement to commit."""
        out = {}
        with self.lock:
            for tp, offset in offsets.items():
                pending = self.pending.get(tp)
                cap = min(pending) if pending else None
                if cap is not None and cap < offset:
                    self._capped[tp] = offset
                    out[tp] = cap
                else:
                    self._capped.pop(tp, None)
                    out[tp] = offset
        return out

    def forget(self, partitions: list[Partition]) -> None:
        """Step 5: partitions now elsewhere; their capped commits are not redone here."""
        with self.lock:
            for tp in partitions:
                self._capped.pop(tp, None)

    def close(self) -> bool:
        """Step 5: no commit from a late acknowledgement after this; True the first time."""
        with self.lock:
            closing, self.closed = not self.closed, True
        return closing
