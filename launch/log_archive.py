"""The run's log on disk: what the embedded broker holds, kept under ``runs/<run_id>/log/``.

The embedded broker (Tansu) keeps its topics in memory, so without this a run's log would be
gone with the broker. While a run goes, an ``Archiver`` thread of the launcher reads every run
topic from where the archive ends and appends each record, exactly as the broker holds it
(offset, timestamp, key, value, headers), to one file per topic partition; every second it
also records the consumer groups' committed offsets (the prompts group's is the data loader's
position). ``restore`` puts an archive back into a fresh broker, offset for offset, so that

- ``asyncrl inspect | replay step | report | audit`` of a finished run work with no broker
  running (``offline_broker`` starts one, restores the archive and stops it again), and
- an ``asyncrl run`` that died (or whose broker died) resumes from its checkpoint against the
  same log when started again.

The archive trails the broker by one fetch (tens of milliseconds); ``Archiver.stop`` drains
it to the broker's end, so a run that ends normally is archived whole.

File format (no pickle: records are read back by a fixed layout): a magic line, then per
record ``u32 length, u32 crc32`` of the body, and the body ``i64 offset, i64 timestamp_ms,
i32 key length (-1: none), key, i32 value length (-1: none), value, u16 header count`` and
per header ``u16 name length, name, u32 value length, value``. A body whose checksum does
not match (a write cut by a crash) ends the file: it is truncated there when reopened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

log = logging.getLogger(__name__)

MAGIC = b"asyncrl-log/1\n"
GROUPS_FILE = "groups.json"
_FRAME = struct.Struct("<II")
_FIXED = struct.Struct("<qq")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_SYNC_EVERY_S = 1.0


class ArchiveError(RuntimeError):
    """An archive that cannot be read back or restored as it was written."""


@dataclass
class ArchivedRecord:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def log_dir(cfg: RunConfig) -> Path:
    return cfg.run_dir / "log"


def run_ref(cfg: RunConfig) -> str:
    """How a reading command (inspect, audit, report, monitor) is to name this run: its
    run_id, with ``--output-dir`` where that is not the default ``runs``. The commands the
    launcher and the monitor suggested named the run_id alone, which looks in runs/."""
    import shlex

    from asyncrl.config import RunConfig

    if Path(cfg.output_dir) == Path(RunConfig.model_fields["output_dir"].default):
        return shlex.quote(cfg.run_id)
    return f"{shlex.quote(cfg.run_id)} --output-dir {shlex.quote(str(cfg.output_dir))}"


def has_archive(cfg: RunConfig) -> bool:
    return any(log_dir(cfg).glob("*/*.log"))


# --- records ------------------------------------------------------------------------------------
def _encode(rec: ArchivedRecord) -> bytes:
    parts = [_FIXED.pack(rec.offset, rec.timestamp_ms)]
    for blob in (rec.key, rec.value):
        parts.append(_I32.pack(-1 if blob is None else len(blob)))
        if blob is not None:
            parts.append(blob)
    parts.append(_U16.pack(len(rec.headers)))
    for name, value in rec.headers:
        raw = name.encode()
        parts += [_U16.pack(len(raw)), raw, _U32.pack(len(value)), value]
    body = b"".join(parts)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _decode(body: bytes) -> ArchivedRecord:
    offset, ts = _FIXED.unpack_from(body, 0)
    pos = _FIXED.size
    blobs: list[bytes | None] = []
    for _ in range(2):
        (n,) = _I32.unpack_from(body, pos)
        pos += _I32.size
        if n < 0:
            blobs.append(None)
        else:
            blobs.append(body[pos : pos + n])
            pos += n
    (count,) = _U16.unpack_from(body, pos)
    pos += _U16.size
    headers = []
    for _ in range(count):
        (n,) = _U16.unpack_from(body, pos)
        pos += _U16.size
        name = body[pos : pos + n].decode()
        pos += n
        (m,) = _U32.unpack_from(body, pos)
        pos += _U32.size
        headers.append((name, body[pos : pos + m]))
        pos += m
    return ArchivedRecord(offset, ts, blobs[0], blobs[1], headers)


def _scan(path: Path) -> Iterator[tuple[int, ArchivedRecord]]:
    """(end position, record) of every intact record of one partition file."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ArchiveError(f"{path} is not an asyncrl log archive file")
        while True:
            frame = f.read(_FRAME.size)
            if len(frame) < _FRAME.size:
                return
            length, crc = _FRAME.unpack(frame)
            body = f.read(length)
            if len(body) < length or zlib.crc32(body) != crc:
                return  # a write cut short by a crash: the file ends before it
            yield f.tell(), _decode(body)


def read_partition(path: Path) -> Iterator[ArchivedRecord]:
    for _end, rec in _scan(path):
        yield rec


def archived_partitions(directory: Path) -> dict[tuple[str, int], Path]:
    """``{(topic, partition): file}`` of an archive directory."""
    return {
        (p.parent.name, int(p.stem)): p
        for p in sorted(directory.glob("*/*.log"))
        if p.stem.isdigit()
    }


class PartitionFile:
    """One partition's append-only file; reopening truncates a torn last record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.next_offset = 0
        end = len(MAGIC)
        if path.exists():
            for pos, rec in _scan(path):
                end, self.next_offset = pos, rec.offset + 1
            with open(path, "r+b") as f:
                f.truncate(end)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(MAGIC)
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 (closed in close())

    def append(self, rec: ArchivedRecord) -> None:
        self._file.write(_encode(rec))
        self.next_offset = rec.offset + 1

    def flush(self) -> None:
        """Hand what was appended to the OS: it then outlives a killed process (not a
        crashed machine: ``sync``)."""
        self._file.flush()

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()


# --- writing while the run goes -----------------------------------------------------------------
class Archiver:
    """A thread that copies every run topic, and the groups' offsets, into the archive."""

    def __init__(self, cfg: RunConfig, bootstrap: str, directory: Path | None = None) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.directory = directory or log_dir(cfg)
        self.files: dict[tuple[str, int], PartitionFile] = {}
        self.archived = 0
        self._stop = threading.Event()
        self._drain_on_stop = True
        self._group_offsets: GroupOffsets | None = None
        self._pending_groups: tuple[dict, dict] | None = None
        """Group offsets read, waiting for the archive to reach the samples' end seen then."""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="log-archiver", daemon=True)

    @property
    def total(self) -> int:
        """Records in the archive, earlier launches' included (``archived``: this one's)."""
        return sum(f.next_offset for f in self.files.values())

    def _file(self, topic: str, partition: int) -> PartitionFile:
        key = (topic, partition)
        if key not in self.files:
            self.files[key] = PartitionFile(self.directory / topic / f"{partition}.log")
        return self.files[key]

    def start(self) -> Archiver:
        self._thread.start()
        return self

    def _run(self) -> None:
        # A raw consumer, not a Reader: every record is copied as it is, including ones whose
        # key or value does not decode (a Reader would dead-letter and skip those).
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        from asyncrl.kafka import client_callbacks, consumer_config

        consumer = None
        try:
            conf = consumer_config(self.cfg.kafka, self.bootstrap, None, background=True)
            consumer = Consumer({**conf, **client_callbacks(self.cfg.kafka, self.bootstrap)})
            topics = [self.cfg.topic(name) for name in self.cfg.kafka.topics.partitions]
            assignment = []
            for topic in topics:
                md = consumer.list_topics(topic, timeout=10).topics[topic]
                for p in sorted(md.partitions):
                    start = self._file(topic, p).next_offset
                    assignment.append(TopicPartition(topic, p, start))
            consumer.assign(assignment)
            last_sync = time.monotonic()
            draining_until: float | None = None
            while True:
                if self._stop.is_set() and not self._drain_on_stop:
                    break
                if self._stop.is_set() and draining_until is None:
                    draining_until = time.monotonic() + 30
                    # The groups' final offsets, read before the ends the drain reaches: a
                    # read still pending from before the roles ended would save old ones.
                    self._read_groups()
                    ends = self._ends(consumer, assignment)
                if draining_until is not None:
                    behind = [k for k, high in ends.items() if self._file(*k).next_offset < high]
                    if not behind:
                        break
                    if time.monotonic() > draining_until:
                        log.warning("log archive: %s not archived to its end within 30 s", behind)
                        break
                written: set[PartitionFile] = set()
                for msg in consumer.consume(num_messages=2000, timeout=0.05):
                    err = msg.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        log.warning("log archive: %s", err)
                    elif err is None:
                        written.add(self._write(msg))
                # Each batch reaches the OS before the next is read: a SIGKILLed launcher left
                # a large sample flushed (past the buffer) and the small control records
                # before it in the buffer, an archive no run ever wrote (audit: over budget).
                for f in written:
                    f.flush()
                if time.monotonic() - last_sync > _SYNC_EVERY_S:
                    self._sync()
                    last_sync = time.monotonic()
            self._sync(groups=self._drain_on_stop)
        except BaseException as err:  # surfaced by stop()
            self._error = err
            log.exception("the log archiver stopped")
        finally:
            if consumer is not None:
                consumer.close()
            if self._group_offsets is not None:
                self._group_offsets.close()
            for f in self.files.values():
                f.close()

    def _ends(self, consumer, assignment) -> dict[tuple[str, int], int]:
        from asyncrl.kafka import consumer_config, read_topics_watermarks

        conf = consumer_config(self.cfg.kafka, self.bootstrap, None)
        topics = sorted({tp.topic for tp in assignment})
        return {tp: high for tp, (_low, high) in read_topics_watermarks(conf, topics).items()}

    def _write(self, msg) -> PartitionFile:
        f = self._file(msg.topic(), msg.partition())
        if msg.offset() < f.next_offset:
            return f  # already archived (a re-read after a reconnect)
        f.append(
            ArchivedRecord(
                msg.offset(),
                msg.timestamp()[1],
                msg.key(),
                msg.value(),
                [(k, v if v is not None else b"") for k, v in (msg.headers() or [])],
            )
        )
        self.archived += 1
        return f

    def _sync(self, groups: bool = True) -> None:
        """Flush the files to disk, and save the groups' offsets once the archive holds every
        sample acknowledged before they were read: a worker commits a prompt only after its
        sample is acknowledged, so a restored prompt offset never skips a sample the archive
        lacks (the prompt is redelivered and generated again instead)."""
        for f in self.files.values():
            f.sync()
        if groups and self._pending_groups is None:
            self._read_groups()
        if self._pending_groups is not None:
            offsets, ends = self._pending_groups
            if all(self._file(*k).next_offset >= high for k, high in ends.items()):
                write_group_offsets(self.directory, offsets)
                self._pending_groups = None

    def _read_groups(self) -> None:
        """Read the groups' offsets, then the samples' ends: saved once archived to them."""
        from asyncrl.kafka import consumer_config, read_watermarks

        try:
            if self._group_offsets is None:
                self._group_offsets = GroupOffsets(self.cfg, self.bootstrap)
            offsets = self._group_offsets.read()
            topic = self.cfg.topic("samples")
            conf = consumer_config(self.cfg.kafka, self.bootstrap, None)
            ends = {(topic, p): high for p, (_l, high) in read_watermarks(conf, topic).items()}
            self._pending_groups = (offsets, ends)
        except Exception as err:  # the broker is away: the last saved offsets stand
            log.warning("log archive: group offsets not read: %s", err)

    def stop(self, drain: bool = True) -> None:
        """Drain to the broker's end (unless ``drain`` is False: the broker is gone), flush to
        disk; raises if the archiver had failed."""
        self._drain_on_stop = drain
        self._stop.set()
        self._thread.join(60)
        if self._error is not None:
            raise ArchiveError(f"archiving the log failed: {self._error}") from self._error


def _groups(cfg: RunConfig) -> dict[str, str]:
    """Consumer group -> the topic whose offsets it commits."""
    return {
        f"{cfg.run_id}.rollout": cfg.topic("prompts"),
        f"{cfg.run_id}.trainer": cfg.topic("samples"),
    }


class GroupOffsets:
    """Reads the committed offsets of the run's consumer groups, with one client per group
    kept for its lifetime (committed() joins no group, so nobody is disturbed): the archiver
    asks every second, and a client made per question cost a connection each time."""

    def __init__(self, cfg: RunConfig, bootstrap: str) -> None:
        from asyncrl.kafka import Reader, raw_decode

        self.topics = _groups(cfg)
        self.readers = {
            group: Reader(cfg.kafka, bootstrap, raw_decode, group_id=group) for group in self.topics
        }

    def read(self) -> dict[str, dict[str, int]]:
        """``{group: {partition: committed next offset}}``."""
        saved: dict[str, dict[str, int]] = {}
        for group, reader in self.readers.items():
            topic = self.topics[group]
            committed = reader.committed([(topic, p) for p in reader.partitions(topic)])
            offsets = {str(p): o for (_t, p), o in committed.items() if o is not None}
            if offsets:
                saved[group] = offsets
        return saved

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


def write_group_offsets(directory: Path, saved: dict[str, dict[str, int]]) -> None:
    tmp = directory / f".{GROUPS_FILE}.tmp"
    directory.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(saved, indent=1))
    tmp.replace(directory / GROUPS_FILE)


# --- putting it back ----------------------------------------------------------------------------
def restore(
    cfg: RunConfig,
    bootstrap: str,
    directory: Path | None = None,
    topics: Collection[str] | None = None,
) -> int:
    """Write an archive into a broker whose run topics are empty; returns the records written.

    Each partition is produced in offset order by one idempotent producer, so the broker
    gives every record its archived offset (checked); then the groups' offsets are committed.
    ``topics``: only these run topics (names as in ``kafka.topics.partitions``, e.g. "steps");
    None: all of them.
    """
    from confluent_kafka import Producer

    from asyncrl.kafka import client_callbacks, count_records, producer_config
    from asyncrl.kafka.records import progress_counter
    from asyncrl.kafka.topics import create_run_topics

    directory = directory or log_dir(cfg)
    create_run_topics(cfg, bootstrap)
    written = 0
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    producer = Producer(
        {**producer_config(cfg.kafka, bootstrap), **client_callbacks(cfg.kafka, bootstrap)}
    )
    expected: dict[str, int] = {}
    partitions = archived_partitions(directory)
    if topics is not None:
        wanted = {cfg.topic(name) for name in topics}
        partitions = {k: path for k, path in partitions.items() if k[0] in wanted}
    for (topic, partition), path in _in_read_order(cfg, partitions):
        if topic not in expected and count_records(cfg.kafka, bootstrap, topic):
            raise ArchiveError(f"{topic} is not empty: an archive is restored into a new broker")
        if topic not in expected:
            expected[topic], counted = 0, progress_counter(f"restoring {topic}")
        for i, rec in enumerate(read_partition(path)):
            if rec.offset != i:
                raise ArchiveError(f"{path}: record {i} has offset {rec.offset} (gap in the log)")
            while True:
                try:
                    producer.produce(
                        topic,
                        value=rec.value,
                        key=rec.key,
                        partition=partition,
                        headers=rec.headers,  # type: ignore[arg-type]  # the stubs' list is invariant
                        timestamp=rec.timestamp_ms,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
            producer.poll(0)
            expected[topic] += 1
            written += 1
            counted(expected[topic])
    remaining = producer.flush(60)
    if failures or remaining:
        raise ArchiveError(f"restoring {directory} failed: {failures[:3] or remaining}")
    for topic, n in expected.items():
        got = count_records(cfg.kafka, bootstrap, topic)
        if got != n:
            raise ArchiveError(f"{topic}: restored {got} records, the archive holds {n}")
    restore_group_offsets(cfg, bootstrap, directory, topics)
    return written


def _in_read_order(
    cfg: RunConfig, partitions: dict[tuple[str, int], Path]
) -> list[tuple[tuple[str, int], Path]]:
    """The archive's files in the audit's READ_ORDER (a live run's archive grows while it is
    restored: what refers to a record is copied before it), other topics last."""
    from asyncrl.kafka.topics import READ_ORDER

    rank = {cfg.topic(name): i for i, name in enumerate(READ_ORDER)}
    return sorted(partitions.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), kv[0]))


def restore_group_offsets(
    cfg: RunConfig, bootstrap: str, directory: Path, only: Collection[str] | None = None
) -> None:
    """Commit the archived groups' offsets (``only``: of the groups on these run topics)."""
    from asyncrl.kafka import Reader, raw_decode

    path = directory / GROUPS_FILE
    if not path.exists():
        return
    topics = _groups(cfg)
    restored = None if only is None else {cfg.topic(name) for name in only}
    for group, offsets in json.loads(path.read_text()).items():
        topic = topics.get(group)
        if topic is None or not offsets or (restored is not None and topic not in restored):
            continue
        with Reader(cfg.kafka, bootstrap, raw_decode, group_id=group) as reader:
            reader.commit({(topic, int(p)): o for p, o in offsets.items()})


@contextlib.contextmanager
def offline_broker(cfg: RunConfig, topics: Collection[str] | None = None) -> Iterator[str]:
    """A broker holding the run's archived log, for tools run after the run (no broker up).
    ``topics``: only the run topics the tool reads; the prompts topic of a long run holds
    millions of records (every step's, fed at the start), and restoring it took minutes
    before ``asyncrl inspect steps`` could read a record."""
    from asyncrl.launch.broker import EmbeddedBroker

    if not has_archive(cfg):
        raise ArchiveError(
            f"no broker is set (kafka.bootstrap_servers) and {log_dir(cfg)} holds no archived "
            "log of this run"
        )
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        restore(cfg, bootstrap, topics=topics)
        yield bootstrap
