"""Weight-version events on the ``control`` topic (docs/design.md, "A sync, as events on control").

Each event is a typed dataclass; on the wire it is a one-row Arrow batch whose schema is
derived from the dataclass fields (tag ``control.<EventName>/<VERSION>``). Every event carries
the run id, the wall-clock time and the version it is about, so the control history of a run
can be read back and a stuck sync diagnosed from the log alone. ``worker`` is -1 for the trainer;
``incarnation`` names one process lifetime of a worker (a restarted worker has a new one).

A sync, in events:
1. trainer  SyncRequested(version=v+1)   after update k with k % trigger_parameter_sync_step == 0
2. worker   RolloutPaused(version=v+1)   admission stopped, in-flight work finished (mode c)
3. trainer  WeightsPublished(version=v+1) the broadcast is done
4. worker   WeightsLoaded(version=v+1)   weights in place (checksum compared)
5. worker   RolloutResumed(version=v+1)  generating again, with its new budget
"""

from __future__ import annotations

import dataclasses
import time
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from asyncrl.schemas.codec import (
    METADATA_KEY,
    SCHEMA_HEADER,
    DecodeError,
    decode_batch,
    encode_batch,
    schema_tag,
    with_tag,
)

VERSION = 3
TRAINER = -1

_ARROW_TYPES: dict[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
    dict[str, int]: pa.map_(pa.string(), pa.int64()),
    dict[str, float]: pa.map_(pa.string(), pa.float64()),
    list[str]: pa.list_(pa.string()),
    list[int]: pa.list_(pa.int64()),
}


@dataclass
class ControlEvent:
    """Fields common to every control event."""

    run_id: str
    version: int
    worker: int = TRAINER
    ts: float = field(default_factory=time.time)
    incarnation: str = ""
    """The publishing worker process's id ("" for the trainer)."""

    registry: ClassVar[dict[str, type[ControlEvent]]] = {}
    headers = dict[str, bytes]()  # not annotated, so not a dataclass field
    """Set on a decoded event: the Kafka headers it came with (its trace context); not a field."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ControlEvent.registry[cls.__name__] = cls

    @classmethod
    def tag(cls) -> str:
        return schema_tag(f"control.{cls.__name__}", VERSION)

    @classmethod
    def schema(cls) -> pa.Schema:
        hints = typing.get_type_hints(cls)
        fields = []
        for f in dataclasses.fields(cls):
            arrow_type = _ARROW_TYPES.get(hints[f.name])
            if arrow_type is None:
                raise TypeError(f"{cls.__name__}.{f.name}: no Arrow type for {hints[f.name]}")
            fields.append(pa.field(f.name, arrow_type, nullable=False))
        return with_tag(pa.schema(fields), f"control.{cls.__name__}", VERSION)


@dataclass
class WorkerStarted(ControlEvent):
    """A rollout worker is up and waiting for its first weights. Repeated every few seconds
    until the trainer accepts it into the weight collective; a new ``incarnation`` of a known
    worker means the old process is gone."""


@dataclass
class WorkerStopped(ControlEvent):
    reason: str = ""
    produced: int = 0


@dataclass
class SyncRequested(ControlEvent):
    """The trainer finished a sync window; ``version`` is the version about to be published."""

    step: int = 0
    consumed: dict[str, int] = field(default_factory=dict)
    """Samples consumed (trained on or dropped) per worker id, cumulative since the run began;
    not the groups dynamic sampling left out, whose slots their worker took back."""


@dataclass
class RolloutPaused(ControlEvent):
    pause_s: float = 0.0
    """From SyncRequested received to paused: in mode (c) the wait for in-flight samples to
    finish decoding (not for their rewards: samples only being scored are published after)."""
    in_flight_finished: int = 0
    """Samples in flight at the pause with every trajectory finished decoding, only being
    scored: published after the weight transfer, under the versions they were generated with."""
    n_partial: int = 0
    produced: int = 0
    """Samples this worker has published in total (for num_stale)."""


@dataclass
class WeightsPublished(ControlEvent):
    transfer_s: float = 0.0
    pause_wait_s: float = 0.0
    bytes: int = 0
    buckets: int = 0
    checksum: str = ""
    step: int = 0
    incarnations: list[str] = field(default_factory=list)
    """The worker incarnations that received these weights (a sync: all; a join: one)."""
    consumed: dict[str, int] = field(default_factory=dict)
    """Samples consumed per worker id so far (a joining worker's staleness count needs it)."""
    members: list[int] = field(default_factory=list)
    """Worker ids the budget of ``version`` is split among (named at its sync; a join repeats
    them). Empty: the version was opened at start-up, split among the configured workers."""


@dataclass
class WeightsLoaded(ControlEvent):
    load_s: float = 0.0
    """The worker's receive and load of the weights (in flight: the transfer into its second
    buffer, not the wait for the trainer to start it)."""
    checksum_ok: bool = True


@dataclass
class RolloutResumed(ControlEvent):
    budget: int = 0
    """Samples this worker may start under this version."""
    num_stale: int = 0
    """This worker's samples from older versions not yet consumed at the sync."""
    idle_ratio: float = 0.0
    """rollouter/idle_ratio over the sync window that ends here (time with nothing to generate)."""
    budget_idle_ratio: float = 0.0
    """Of that, the part with the version's budget spent (rollouter/budget_idle_ratio): the
    worker could have generated, the staleness budget held it back."""
    engine_occupancy: float = -1.0
    """rollouter/engine_occupancy over the window: the time-weighted mean of the requests
    decoding over the engine's full batch (capped at 1; 0 while idle). -1: not measured."""
    budget_unfilled_ratio: float = -1.0
    """rollouter/budget_unfilled_ratio: the time-weighted mean of the engine's empty share while
    the version's budget was spent (idle time out of budget counts whole): the throughput the
    staleness budget cost this window. -1: not measured."""


@dataclass
class SamplesDropped(ControlEvent):
    """Samples given up: by the trainer (e.g. beyond max_version_lag; the worker may refill its
    budget), or by a worker (in flight when the run finished)."""

    target_worker: int = 0
    count: int = 0
    reason: str = ""
    sample_ids: list[str] = field(default_factory=list)
    """Which samples: with the samples topic, accounts for every prompt taken."""


@dataclass
class BudgetGranted(ControlEvent):
    """The trainer gives ``target_worker`` ``count`` more samples of ``version``: the unfilled
    share of a worker that left mid-version, which the version could not fill without."""

    target_worker: int = 0
    count: int = 0
    reason: str = ""


@dataclass
class TrainerResumed(ControlEvent):
    """The trainer restarted from its checkpoint of ``step``. Step records numbered above
    ``step`` that an earlier trainer wrote are void (their updates were lost with it; their
    samples are trained again), and the checkpoint's weights are published as ``version``,
    above every version already on the log, so no version number names two sets of weights."""

    step: int = 0
    checkpoint_version: int = 0
    """The version the checkpoint was written under."""
    last_logged_version: int = -1
    """The highest version on the log when the trainer restarted."""


@dataclass
class Validated(ControlEvent):
    """A rollout worker's held-out evaluation of ``version`` (async_training.
    use_trainer_do_validate=false): the weights of trainer step ``step``."""

    step: int = 0
    accuracy: float = 0.0
    tool_use: float = -1.0
    """The agent loop's tool-use rate; -1 without the agent loop."""
    eval_s: float = 0.0


@dataclass
class RunFinished(ControlEvent):
    step: int = 0
    reason: str = ""


def encode_event(event: ControlEvent) -> bytes:
    schema = type(event).schema()
    row = dataclasses.asdict(event)
    cols = {
        name: [list(row[name].items()) if isinstance(row[name], dict) else row[name]]
        for name in schema.names
    }
    return encode_batch(pa.RecordBatch.from_pydict(cols, schema=schema))


def event_tag(headers: dict[str, bytes] | None) -> str:
    raw = (headers or {}).get(SCHEMA_HEADER)
    return raw.decode(errors="replace") if raw else ""


def decode_event(data: bytes | None, headers: dict[str, bytes] | None = None) -> ControlEvent:
    """Decode by the schema header (or, without headers, by the Arrow metadata)."""
    tag = event_tag(headers)
    if not tag:
        try:
            meta = pa.ipc.open_stream(pa.py_buffer(data or b"")).schema.metadata or {}
        except (pa.ArrowInvalid, OSError) as err:
            raise DecodeError(f"control event: not an Arrow IPC stream ({err})") from None
        tag = meta.get(METADATA_KEY, b"").decode(errors="replace")
    name, _, _ = tag.partition("/")
    cls = ControlEvent.registry.get(name.removeprefix("control."))
    if not name.startswith("control.") or cls is None:
        raise DecodeError(f"unknown control event schema {tag!r}")
    batch = decode_batch(data, cls.schema(), cls.tag(), headers=headers)
    if batch.num_rows != 1:
        raise DecodeError(f"{tag}: expected 1 row, got {batch.num_rows}")
    row = batch.to_pylist()[0]
    for f in batch.schema:
        if pa.types.is_map(f.type):  # Arrow maps decode as lists of pairs
            row[f.name] = dict(row[f.name])
    event = cls(**row)
    event.headers = dict(headers or {})
    return event
