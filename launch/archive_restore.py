"""Putting a run's archived log back into a broker, offset for offset, and a broker that holds
it for the tools that read a finished run."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.launch.archive_file import (
    GROUPS_FILE,
    ArchiveError,
    _groups,
    archived_partitions,
    has_archive,
    log_dir,
    read_partition,
)

if TYPE_CHECKING:
    from asyncrl.config import RunConfig


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
    millions of records (every step's, fed at the start), which take minutes to restore."""
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
