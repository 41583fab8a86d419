"""Reading a topic by time returns exactly the records at or after the time, even where the
broker's offset-for-time lookup answers the start of an earlier record batch (Tansu)."""

import pytest

from asyncrl.kafka import Publisher
from asyncrl.kafka.records import read_records

pytestmark = pytest.mark.kafka


def test_since_and_until_select_exactly_by_timestamp(run_cfg):
    bootstrap = run_cfg.kafka.bootstrap_servers
    base = 1_700_000_000_000
    with Publisher(run_cfg.kafka, bootstrap) as pub:  # one flush: a single record batch
        for i in range(10):
            pub.publish(run_cfg.topic("steps"), str(i), b"x", timestamp_ms=base + 1000 * i)

    since = [r.key for r in read_records(run_cfg, bootstrap, "steps", since_ms=base + 4500)]
    assert since == ["5", "6", "7", "8", "9"]
    window = read_records(run_cfg, bootstrap, "steps", since_ms=base + 2000, until_ms=base + 4000)
    assert [r.key for r in window] == ["2", "3"]
    assert list(read_records(run_cfg, bootstrap, "steps", since_ms=base + 60_000)) == []
