"""A member's join state, from librdkafka's statistics (kafka.group_watch)."""

import json
import time

from asyncrl.kafka.group_watch import GroupWatch


def _stats(join_state: str) -> str:
    return json.dumps({"name": "rdkafka#consumer-1", "cgrp": {"join_state": join_state}})


def test_quiet_only_between_joins_and_as_of_a_fresh_report():
    watch = GroupWatch()
    assert not watch.quiet()  # no report yet
    watch.on_stats(json.dumps({"name": "rdkafka#consumer-1"}))  # no group part: ignored
    assert watch.join_state is None and not watch.quiet()
    watch.on_stats(_stats("init"))  # before the first join went out
    assert watch.quiet()
    for busy in ("wait-join", "wait-sync", "wait-assign-call", "wait-unassign-call"):
        watch.on_stats(_stats(busy))
        assert not watch.quiet(), busy
    watch.on_stats(_stats("steady"))
    assert watch.quiet()
    time.sleep(0.05)
    assert watch.quiet(max_age_s=1.0) and not watch.quiet(max_age_s=0.01)  # a stale report
