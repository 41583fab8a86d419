"""An in-process stand-in for the broker and the weight transport, so a test drives a trainer
step or a sync hand-shake in milliseconds. The broker tests stay the integration layer.

``MemoryBroker`` keeps topics as lists of raw records (one partition each) and hands out
publishers and readers with the methods the roles use of ``asyncrl.kafka``'s (publish, flush,
poll; assign, poll, commit, end offsets, watermarks); values go through the real encoders and
decoders, so the wire format is exercised too. ``LocalWeights`` is a weight transport between
objects of one process: the trainer's end copies its weights into each connected worker end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.io import TrainerIO
from asyncrl.kafka.record import Decoder, Record
from asyncrl.schemas import control as ev
from asyncrl.sync.channel import ControlChannel, highest_version
from asyncrl.sync.collective import BroadcastResult, TransferStats

T = TypeVar("T")


@dataclass
class MemoryBroker:
    """Topics in memory, one partition each; offsets count from 0 per topic."""

    topics: dict[str, list[Record[bytes | None]]] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    reactions: list[Callable[[Record[bytes | None]], None]] = field(default_factory=list)
    """Called with each record appended (a test's scripted other side: a worker that pauses
    when a sync is requested, say)."""

    def publisher(self) -> MemoryPublisher:
        return MemoryPublisher(self)

    def reader(self, decode: Decoder[T]) -> MemoryReader[T]:
        return MemoryReader(self, decode)

    def append(
        self, topic: str, key: str | None, value: bytes | None, headers: Mapping[str, bytes]
    ) -> Record[bytes | None]:
        log = self.topics.setdefault(topic, [])
        rec = Record(topic, 0, len(log), key, int(time.time() * 1000), dict(headers), value)
        log.append(rec)
        for react in list(self.reactions):
            react(rec)
        return rec

    def control(
        self, cfg: RunConfig, worker: int = ev.TRAINER, incarnation: str = ""
    ) -> ControlChannel:
        """A real ``ControlChannel`` over this broker's ``control`` topic."""
        return ControlChannel(
            cfg,
            self.publisher(),
            self.reader(ev.decode_event),
            worker=worker,
            incarnation=incarnation,
        )

    def events(self, cfg: RunConfig) -> list[ev.ControlEvent]:
        """Every event on the run's control topic so far, decoded."""
        return [
            ev.decode_event(r.value, r.headers) for r in self.topics.get(cfg.topic("control"), [])
        ]


class MemoryPublisher:
    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker

    def publish(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        headers: Mapping[str, str | bytes] | None = None,
        timestamp_ms: int | None = None,
        on_acked: Callable[[], None] | None = None,
    ) -> None:
        raw = {k: v.encode() if isinstance(v, str) else v for k, v in (headers or {}).items()}
        self.broker.append(topic, key, value, raw)
        if on_acked is not None:
            on_acked()  # acknowledged at once: there is no broker to wait for

    def flush(self, timeout: float = 30.0) -> None:
        pass

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryReader(Generic[T]):
    """Reads assigned topics from a position; ``poll`` never blocks (there is no one to wait
    for: a test publishes first, then polls)."""

    def __init__(self, broker: MemoryBroker, decode: Decoder[T]) -> None:
        self.broker = broker
        self.decode = decode
        self.positions: dict[str, int] = {}

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        return {0: (0, len(self.broker.topics.get(topic, [])))}

    def assign(self, topic: str, offsets: Mapping[int, int] | None = None) -> None:
        self.positions[topic] = (offsets or {}).get(0, 0)

    def poll(self, timeout: float, max_records: int = 500) -> list[Record[T]]:
        out: list[Record[T]] = []
        for topic, position in self.positions.items():
            for raw in self.broker.topics.get(topic, [])[position : position + max_records]:
                value = self.decode(raw.value, raw.headers)
                out.append(
                    Record(raw.topic, 0, raw.offset, raw.key, raw.timestamp_ms, raw.headers, value)
                )
                self.positions[topic] = raw.offset + 1
        return out

    def end_offsets(self, topic: str, timeout: float = 5.0, ask: bool = True) -> dict[int, int]:
        return {0: len(self.broker.topics.get(topic, []))}

    def commit(self, offsets: Mapping[tuple[str, int], int], asynchronous: bool = False) -> None:
        self.broker.committed.update(offsets)

    def close(self) -> None:
        pass


class LocalWeights:
    """The trainer's end of an in-process weight transport; ``sink(worker)`` makes a worker's."""

    def __init__(self) -> None:
        self.members: dict[int, str] = {}
        self.sinks: dict[int, LocalSink] = {}
        self.sent: list[list[int]] = []
        """The workers each broadcast went to, in order."""

    def sink(self, worker: int) -> LocalSink:
        self.sinks[worker] = LocalSink()
        return self.sinks[worker]

    def connect(self, worker: int, incarnation: str) -> bool:
        if worker not in self.sinks:
            return False  # nobody at the other end
        self.members[worker] = incarnation
        return True

    def disconnect(self, worker: int) -> None:
        self.members.pop(worker, None)

    def broadcast(
        self, model: torch.nn.Module, bucket_bytes: int, workers: list[int] | None = None
    ) -> BroadcastResult:
        t0 = time.perf_counter()
        targets = sorted(self.members) if workers is None else workers
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for worker in targets:
            self.sinks[worker].pending.append(state)
        self.sent.append(list(targets))
        size = sum(t.numel() * t.element_size() for t in state.values())
        stats = TransferStats(size, time.perf_counter() - t0, 1, len(state))
        return BroadcastResult(stats, {w: self.members[w] for w in targets})

    def close(self) -> None:
        pass


@dataclass
class LocalSink:
    """A worker's end of ``LocalWeights``: what was broadcast to it, loaded on receive."""

    pending: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def receive_into(self, model: torch.nn.Module, bucket_bytes: int) -> TransferStats:
        t0 = time.perf_counter()
        state = self.pending.pop(0)
        model.load_state_dict(state)
        size = sum(t.numel() * t.element_size() for t in state.values())
        return TransferStats(size, time.perf_counter() - t0, 1, len(state))

    def close(self) -> None:
        pass


def trainer_io(cfg: RunConfig, broker: MemoryBroker, weights: LocalWeights | None) -> TrainerIO:
    """The trainer's inputs and outputs over ``broker`` and ``weights`` (None: no workers)."""
    from asyncrl.schemas.sample import decode_sample

    return TrainerIO(
        samples=broker.reader(decode_sample),
        publisher=broker.publisher(),
        control=broker.control(cfg),
        weights=lambda _device: weights,
        last_logged_version=lambda: highest_version(broker.events(cfg)),
    )
