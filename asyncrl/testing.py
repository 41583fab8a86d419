"""An in-process stand-in for the broker and the weight transport, so a test drives a trainer
step or a worker's sync hand-shake in milliseconds. The broker tests stay the integration layer.

``MemoryBroker`` keeps topics as lists of raw records (one partition each) and hands out
publishers and readers with the methods the roles use of ``asyncrl.kafka``'s (publish, flush,
poll; assign, poll, commit, end offsets, watermarks); values go through the real encoders and
decoders, so the wire format is exercised too. ``MemoryPromptSource`` is a worker's share of
the prompts topic. ``LocalWeights`` is a weight transport between objects of one process: the
trainer's end copies its weights into each connected worker end. ``ScriptedTrainer`` plays the
trainer's side of the hand-shake for a worker under test (``trainer_io`` and ``worker_io``
wire a real trainer or worker to all of these).
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from asyncrl.config import RunConfig
from asyncrl.consumers.io import TrainerIO
from asyncrl.kafka.record import Decoder, Record
from asyncrl.kafka.records import LogScan
from asyncrl.producers.io import OnAssign, OnRevoke, WorkerIO
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.prompt import TAG as PROMPT_TAG
from asyncrl.schemas.prompt import PromptRecord, decode_prompt, encode_prompt
from asyncrl.sync.buckets import cast_dtype
from asyncrl.sync.channel import ControlChannel, highest_version
from asyncrl.sync.checksum import weights_checksum
from asyncrl.sync.results import BroadcastResult, TransferStats

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

    def read(self, cfg: RunConfig, name: str, decode: Decoder[T]) -> list[T]:
        """Every record of the run's topic ``name`` so far, decoded."""
        return [decode(r.value, r.headers) for r in self.topics.get(cfg.topic(name), [])]

    def feed(self, cfg: RunConfig, count: int) -> list[PromptRecord]:
        """The run's first ``count`` training prompts (epoch 0, in order) on ``prompts``."""
        from asyncrl.producers.feed import train_prompts

        prompts = train_prompts(cfg)[0][:count]
        for p in prompts:
            self.append(
                cfg.topic("prompts"),
                p.prompt_id,
                encode_prompt(p),
                {SCHEMA_HEADER: PROMPT_TAG.encode()},
            )
        return prompts

    def scan(self, cfg: RunConfig) -> LogScan:
        """A ``LogScan`` of the run's topics (the worker's recovery index reads with it)."""

        def scan(name: str, starts: dict[int, int] | None) -> list[Record[bytes | None]]:
            return self.topics.get(cfg.topic(name), [])[(starts or {}).get(0, 0) :]

        return scan


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

    def watermarks(self, topic: str, exact: bool = True) -> dict[int, tuple[int, int]]:
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
        self,
        model: torch.nn.Module,
        bucket_bytes: int,
        workers: list[int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> BroadcastResult:
        t0 = time.perf_counter()
        targets = sorted(self.members) if workers is None else workers
        state = {
            k: v.detach().to(cast_dtype(v.dtype, dtype), copy=True)
            for k, v in model.state_dict().items()
        }
        for worker in targets:
            self.sinks[worker].put(state)
        self.sent.append(list(targets))
        size = sum(t.numel() * t.element_size() for t in state.values())
        stats = TransferStats(size, time.perf_counter() - t0, 1, len(state))
        return BroadcastResult(stats, {w: self.members[w] for w in targets})

    def close(self) -> None:
        pass


@dataclass
class LocalSink:
    """A worker's end of ``LocalWeights``: what was broadcast to it, loaded on receive (which
    waits for a broadcast, as the collective's does: the in-flight update receives on a
    thread, ahead of the broadcast)."""

    sent: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """Every state broadcast to this end, in order."""
    pending: queue.Queue[dict[str, torch.Tensor]] = field(default_factory=queue.Queue)
    closed: bool = False

    def put(self, state: dict[str, torch.Tensor]) -> None:
        self.sent.append(state)
        self.pending.put(state)

    def join(
        self,
        worker: int,
        incarnation: str,
        announce: Callable[[], None],
        waiting: Callable[[], None] | None = None,
    ) -> None:
        announce()  # the trainer's side connects it (see ScriptedTrainer)

    def await_transfer(self, waiting: Callable[[], None]) -> None:
        while self.pending.empty() and not self.closed:
            waiting()
            time.sleep(0.05)

    def receive_into(self, model: torch.nn.Module, bucket_bytes: int) -> TransferStats:
        t0 = time.perf_counter()
        while True:
            try:
                state = self.pending.get(timeout=0.05)
                break
            except queue.Empty:
                if self.closed:
                    raise RuntimeError("the local weight sink was closed") from None
        model.load_state_dict(state)
        size = sum(t.numel() * t.element_size() for t in state.values())
        return TransferStats(size, time.perf_counter() - t0, 1, len(state))

    def close(self) -> None:
        self.closed = True


class MemoryPromptSource:
    """A worker's share of the prompts topic: all of it (one partition, assigned at once).
    ``revoke`` moves the partition away, as a rebalance would."""

    def __init__(
        self, cfg: RunConfig, broker: MemoryBroker, on_assign: OnAssign, on_revoke: OnRevoke
    ) -> None:
        self.reader = broker.reader(decode_prompt)
        self.topic = cfg.topic("prompts")
        self.reader.assign(self.topic, {0: broker.committed.get((self.topic, 0), 0)})
        self.on_revoke = on_revoke
        self.owned = True
        self.buffer: list[Record[PromptRecord]] = []
        self.open: set[int] = set()
        """Offsets taken and not done."""
        self.closed = False
        on_assign({0})

    def keep_alive(self) -> None:
        if self.owned:
            self.buffer.extend(self.reader.poll(0.0))

    def take(self, timeout: float) -> Record[PromptRecord] | None:
        return self.take_where(lambda rec: True)

    def take_where(
        self, wanted: Callable[[Record[PromptRecord]], bool]
    ) -> Record[PromptRecord] | None:
        self.keep_alive()
        for i, rec in enumerate(self.buffer):
            if wanted(rec):
                del self.buffer[i]
                self.open.add(rec.offset)
                return rec
        return None

    def done(self, rec: Record[PromptRecord]) -> None:
        """Commit as far as no earlier prompt is open or buffered (as ``PromptSource``)."""
        self.open.discard(rec.offset)
        waiting = self.open | {r.offset for r in self.buffer}
        high = self.reader.positions[self.topic]
        self.reader.commit({(self.topic, 0): min(waiting) if waiting else high})

    def revoke(self, lost: bool = False) -> None:
        """The partition moves to another worker: it hands back what it holds of it."""
        self.owned = False
        self.buffer.clear()
        self.on_revoke({0}, lost)
        self.open.clear()

    def close(self) -> None:
        self.closed = True


class ScriptedTrainer:
    """The trainer's side of the hand-shake, for a worker under test, run by the broker's
    reactions (so in the worker's own thread): a worker that announces itself (WorkerStarted)
    is connected and sent the current weights; once every member has paused for a requested
    sync (with ``in_flight_update``: at once), the weights of the new version are sent and
    published. ``model`` is what is sent."""

    def __init__(
        self, cfg: RunConfig, broker: MemoryBroker, weights: LocalWeights, model: torch.nn.Module
    ) -> None:
        from asyncrl.models.policy import rollout_dtype

        self.cfg = cfg
        self.weights = weights
        self.model = model
        self.dtype = rollout_dtype(cfg)
        """What the weights are cast to on the way (the worker's rollout.dtype)."""
        self.checksum_like: str | None = None
        """The format of its checksums (None: the weights' device's; ``wsum64:`` is what a
        trainer on a GPU publishes)."""
        self.control = broker.control(cfg)
        self.version = 0
        self.step = 0
        """The trainer step its weights are at (WeightsPublished.step)."""
        self.requested: int | None = None
        self.paused: set[int] = set()
        self.consumed: dict[str, int] = {}
        broker.reactions.append(self._react)

    def _react(self, rec: Record[bytes | None]) -> None:
        if rec.topic != self.cfg.topic("control"):
            return
        event = ev.decode_event(rec.value, rec.headers)
        if isinstance(event, ev.WorkerStarted):
            if self.weights.connect(event.worker, event.incarnation):
                self._send([event.worker])
        elif isinstance(event, ev.RolloutPaused) and event.version == self.requested:
            self.paused.add(event.worker)
            if self.paused >= set(self.weights.members):
                self.version, self.requested = event.version, None
                self._send(sorted(self.weights.members), members=sorted(self.weights.members))

    def _send(self, workers: list[int], members: list[int] | None = None) -> None:
        result = self.weights.broadcast(
            self.model, bucket_bytes=1 << 20, workers=workers, dtype=self.dtype
        )
        self.control.publish(
            ev.WeightsPublished(
                run_id=self.cfg.run_id,
                version=self.version,
                checksum=weights_checksum(self.model, like=self.checksum_like, dtype=self.dtype),
                step=self.step,
                incarnations=list(result.delivered.values()),
                consumed=dict(self.consumed),
                members=members or [],
            )
        )

    def request_sync(self) -> None:
        """SyncRequested for the next version (the workers pause, then it is sent)."""
        self.requested, self.paused = self.version + 1, set()
        self.control.publish(
            ev.SyncRequested(run_id=self.cfg.run_id, version=self.requested, consumed=self.consumed)
        )
        if self.cfg.async_training.in_flight_update:  # nobody pauses: sent at once
            self.version, self.requested = self.requested, None
            self._send(sorted(self.weights.members), members=sorted(self.weights.members))

    def finish(self) -> None:
        self.control.publish(ev.RunFinished(run_id=self.cfg.run_id, version=self.version))


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


def worker_io(
    cfg: RunConfig,
    broker: MemoryBroker,
    weights: LocalWeights,
    worker: int = 0,
    prompts: list[MemoryPromptSource] | None = None,
) -> WorkerIO:
    """A rollout worker's inputs and outputs over ``broker`` and ``weights``; each prompt
    source the worker opens is appended to ``prompts`` (a test revokes its partition)."""

    def open_prompts(on_assign: OnAssign, on_revoke: OnRevoke) -> MemoryPromptSource:
        source = MemoryPromptSource(cfg, broker, on_assign, on_revoke)
        if prompts is not None:
            prompts.append(source)
        return source

    return WorkerIO(
        publisher=broker.publisher(),
        control=broker.control(cfg, worker=worker, incarnation=uuid.uuid4().hex[:12]),
        prompts=open_prompts,
        weights=lambda _device: weights.sink(worker),
        scan_log=broker.scan(cfg),
    )
