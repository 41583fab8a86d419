"""The two seams every role publishes and reads through, as interfaces: ``Publisher`` and
``Reader`` here implement them over Kafka, ``asyncrl.testing``'s memory broker in process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from asyncrl.kafka.record import Record

T = TypeVar("T")


class Sink(Protocol):
    """Where records are published."""

    def publish(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        headers: Mapping[str, str | bytes] | None = None,
        timestamp_ms: int | None = None,
        on_acked: Callable[[], None] | None = None,
    ) -> None: ...

    def flush(self, timeout: float = 30.0) -> None: ...

    def poll(self, timeout: float = 0.0) -> int:
        """Serve acknowledgements that arrived (their ``on_acked`` callbacks); how many."""
        ...

    def check(self) -> None:
        """Raise a delivery failure reported since the last call."""
        ...


class Source(Protocol[T]):
    """A topic read from a position, decoded."""

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]: ...

    def assign(self, topic: str, offsets: Mapping[int, int] | None = None) -> None: ...

    def poll(self, timeout: float, max_records: int = 500) -> list[Record[T]]: ...

    def commit(
        self, offsets: Mapping[tuple[str, int], int], asynchronous: bool = False
    ) -> None: ...

    def end_offsets(self, topic: str, timeout: float = 5.0, ask: bool = True) -> dict[int, int]: ...

    def close(self) -> None: ...
