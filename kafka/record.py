"""A consumed message, typed: what readers hand out, and the headers a dead letter carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from confluent_kafka import (
    Message,
)

T = TypeVar("T")
HEADER_ERROR = "error"
HEADER_SOURCE_TOPIC = "source-topic"
HEADER_SOURCE_PARTITION = "source-partition"
HEADER_SOURCE_OFFSET = "source-offset"
HEADER_REPLAYED_FROM = "replayed-from"
"""On a record ``asyncrl replay topic`` copied from another run (the run's topic): its
versions are that run's, which this run's control log never granted."""


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
    # A consumed message's headers are (key, bytes | None) pairs; the stubs type headers() as
    # the wider HeadersType that produce() accepts (a dict, or str values).
    pairs = cast("list[tuple[str, bytes | None]]", msg.headers() or [])
    return {k: (v if v is not None else b"") for k, v in pairs}


def coordinates(msg: Message) -> tuple[str, int, int]:
    """A fetched message's topic, partition and offset (the stubs type them optional: an error
    event may lack them, a message never does)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


Decoder = Callable[[bytes | None, dict[str, bytes]], T]
PartitionsCallback = Callable[[list[tuple[str, int]]], None]


def raw_decode(value: bytes | None, headers: dict[str, bytes]) -> bytes | None:
    """Identity decoder, for readers that want the bytes as they are."""
    return value
