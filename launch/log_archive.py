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

The archive's files and their format are ``launch/archive_file.py``; putting an archive back
into a broker is ``launch/archive_restore.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.launch.archive_file import (
    GROUPS_FILE,
    ArchivedRecord,
    ArchiveError,
    PartitionFile,
    _groups,
    archived_partitions,
    has_archive,
    log_dir,
    read_partition,
    write_group_offsets,
)
from asyncrl.launch.archive_restore import (
    _in_read_order,
    offline_broker,
    restore,
    restore_group_offsets,
)

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

__all__ = [
    "GROUPS_FILE",
    "ArchiveError",
    "ArchivedRecord",
    "Archiver",
    "GroupOffsets",
    "PartitionFile",
    "_in_read_order",
    "archived_partitions",
    "has_archive",
    "log_dir",
    "offline_broker",
    "read_partition",
    "restore",
    "restore_group_offsets",
    "run_ref",
]

log = logging.getLogger(__name__)

_SYNC_EVERY_S = 1.0
"""How often the archive is synced to disk and the groups' offsets read."""


def run_ref(cfg: RunConfig) -> str:
    """How a reading command (inspect, audit, report, monitor) is to name this run: its
    run_id, with ``--output-dir`` where that is not the default ``runs`` (the run_id alone
    looks in runs/)."""
    import shlex

    from asyncrl.config import RunConfig

    if Path(cfg.output_dir) == Path(RunConfig.model_fields["output_dir"].default):
        return shlex.quote(cfg.run_id)
    return f"{shlex.quote(cfg.run_id)} --output-dir {shlex.quote(str(cfg.output_dir))}"


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
                # Each batch reaches the OS before the next is read, so a killed launcher
                # leaves a prefix of the log (not a large sample without the control records
                # before it, which stayed in the buffer).
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
