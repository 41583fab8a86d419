"""A run's log archived while it is written, and restored into a new broker offset for
offset, with the consumer groups' positions: what a restarted run and the offline tools read."""

from __future__ import annotations

import json

import pytest

from asyncrl.kafka import Publisher, Reader, raw_decode
from asyncrl.kafka.records import read_records
from asyncrl.launch.broker import EmbeddedBroker
from asyncrl.launch.log_archive import Archiver, offline_broker, restore
from asyncrl.schemas import SCHEMA_HEADER

pytestmark = pytest.mark.kafka


def _snapshot(cfg, bootstrap) -> dict:
    return {
        name: sorted(
            (r.partition, r.offset, r.timestamp_ms, r.key, r.value, sorted(r.headers.items()))
            for r in read_records(cfg, bootstrap, name)
        )
        for name in ("prompts", "samples", "control", "dead-letter")
    }


def test_an_archived_log_is_restored_offset_for_offset(make_run_cfg):
    cfg = make_run_cfg()
    bootstrap = cfg.kafka.bootstrap_servers
    archiver = Archiver(cfg, bootstrap).start()
    with Publisher(cfg.kafka, bootstrap) as pub:
        for i in range(40):
            pub.publish(cfg.topic("prompts"), f"p{i}", f"prompt {i}".encode(), {SCHEMA_HEADER: "x"})
        pub.publish(cfg.topic("samples"), "s0", b"\x00garbage", {"h": b"\xff\x00"})
        pub.publish(cfg.topic("samples"), None, None)  # a tombstone-like record
        pub.publish(cfg.topic("control"), "run", b"event", timestamp_ms=1_600_000_000_000)
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.rollout") as group:
        group.commit({(cfg.topic("prompts"), p): 3 for p in group.partitions(cfg.topic("prompts"))})
    archiver.stop()  # drains to the end
    assert archiver.archived == 43
    before = _snapshot(cfg, bootstrap)

    with EmbeddedBroker() as fresh:
        cfg.kafka.bootstrap_servers = fresh.bootstrap
        assert restore(cfg, fresh.bootstrap) == 43
        assert _snapshot(cfg, fresh.bootstrap) == before
        topic = cfg.topic("prompts")
        with Reader(cfg.kafka, fresh.bootstrap, raw_decode, group_id=f"{cfg.run_id}.rollout") as g:
            committed = g.committed([(topic, p) for p in g.partitions(topic)])
        assert set(committed.values()) == {3}

    with offline_broker(cfg) as offline:  # what inspect/report/audit use with no broker up
        assert _snapshot(cfg, offline) == before


def test_archiving_resumes_where_the_archive_ends(make_run_cfg):
    cfg = make_run_cfg()
    bootstrap = cfg.kafka.bootstrap_servers
    with Publisher(cfg.kafka, bootstrap) as pub:
        for i in range(5):
            pub.publish(cfg.topic("steps"), str(i), b"a")
    Archiver(cfg, bootstrap).start().stop()
    with Publisher(cfg.kafka, bootstrap) as pub:
        for i in range(5, 8):
            pub.publish(cfg.topic("steps"), str(i), b"b")
    second = Archiver(cfg, bootstrap).start()
    second.stop()
    assert second.archived == 3  # only what was new
    with EmbeddedBroker() as fresh:
        restore(cfg, fresh.bootstrap)
        keys = sorted(int(r.key) for r in read_records(cfg, fresh.bootstrap, "steps"))
    assert keys == list(range(8))


def test_the_groups_offsets_archived_at_the_end_are_read_at_the_end(make_run_cfg):
    """A read of the groups' offsets still waiting, at the stop, for the archive to reach its
    samples' end must not be what the archive keeps: a run whose last steps fell between two
    reads left offsets older than its end (CI: an audit found no prompt committed)."""
    from asyncrl.launch.log_archive import GROUPS_FILE

    cfg = make_run_cfg()
    bootstrap = cfg.kafka.bootstrap_servers
    topic = cfg.topic("prompts")
    with Publisher(cfg.kafka, bootstrap) as pub:
        for i in range(8):
            pub.publish(topic, f"p{i}", b"prompt", {SCHEMA_HEADER: "x"})
    archiver = Archiver(cfg, bootstrap)
    # A read taken before the group committed, waiting on a samples' end not yet archived.
    archiver._pending_groups = ({}, {(cfg.topic("samples"), 0): 10**9})
    archiver.start()
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.rollout") as group:
        group.commit({(topic, p): 2 for p in group.partitions(topic)})
    archiver.stop()
    saved = json.loads((archiver.directory / GROUPS_FILE).read_text())
    assert set(saved[f"{cfg.run_id}.rollout"].values()) == {2}


def test_a_tool_gets_only_the_topics_it_reads_restored(make_run_cfg):
    """``asyncrl inspect steps`` on a long run restored its millions of prompts first."""
    cfg = make_run_cfg()
    bootstrap = cfg.kafka.bootstrap_servers
    archiver = Archiver(cfg, bootstrap).start()
    with Publisher(cfg.kafka, bootstrap) as pub:
        for i in range(30):
            pub.publish(cfg.topic("prompts"), f"p{i}", b"prompt")
        for i in range(3):
            pub.publish(cfg.topic("steps"), str(i), b"step")
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.rollout") as group:
        group.commit({(cfg.topic("prompts"), p): 1 for p in group.partitions(cfg.topic("prompts"))})
    archiver.stop()
    with offline_broker(cfg, topics=("steps",)) as offline:
        assert len(list(read_records(cfg, offline, "steps"))) == 3
        assert list(read_records(cfg, offline, "prompts")) == []


def test_a_long_restore_and_read_report_their_progress(make_run_cfg, monkeypatch):
    """The offline tools restored and read a long run's log (millions of records, minutes)
    with nothing on the screen; reads and restores now report how far they are, and the CLI
    shows it on a terminal."""
    import io

    from rich.console import Console

    from asyncrl.cli.find_run import reading_shown
    from asyncrl.kafka import records

    monkeypatch.setattr(records, "REPORT_EVERY", 10)
    cfg = make_run_cfg()
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        for i in range(45):
            pub.publish(cfg.topic("steps"), str(i), b"step")
    Archiver(cfg, cfg.kafka.bootstrap_servers).start().stop()

    told: list[tuple[str, int]] = []
    report = records.reporting_progress(lambda what, n: told.append((what, n)))
    with report, offline_broker(cfg, ["steps"]) as offline:
        assert len(list(read_records(cfg, offline, "steps"))) == 45
    topic = cfg.topic("steps")
    restoring = [n for what, n in told if what == f"restoring {topic}"]
    reading = [n for what, n in told if what == f"reading {topic}"]
    assert restoring == [10, 20, 30, 40]
    assert reading and reading == sorted(reading) and 10 <= reading[-1] <= 45
    told.clear()
    list(read_records(cfg, cfg.kafka.bootstrap_servers, "steps"))
    assert not told  # outside the block nothing is told

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    with reading_shown("audit", terminal):
        records.progress_reporter()("reading demo.steps", 1_234)  # type: ignore[misc]
    assert "audit: reading demo.steps: 1,234 records" in screen.getvalue()
    off_terminal = Console(file=io.StringIO(), force_terminal=False)
    with reading_shown("audit", off_terminal):
        assert records.progress_reporter() is None  # pipes and logs get no live line
