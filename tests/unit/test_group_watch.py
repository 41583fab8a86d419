"""A member's view of its group's rebalances, from librdkafka's statistics (kafka.group_watch)."""

import json
import time

from asyncrl.kafka.group_watch import GroupWatch


def _stats(join_state: str, rebalance_age_ms: int, rebalance_cnt: int = 1) -> str:
    cgrp = {"join_state": join_state, "rebalance_age": rebalance_age_ms}
    return json.dumps(
        {"name": "rdkafka#consumer-1", "cgrp": {**cgrp, "rebalance_cnt": rebalance_cnt}}
    )


def test_settled_only_when_steady_and_quiet_for_long_enough():
    watch = GroupWatch()
    assert not watch.settled(0.0)  # no report yet
    watch.on_stats(json.dumps({"name": "c"}))  # no group (an assign-only reader)
    assert not watch.settled(0.0)
    watch.on_stats(_stats("steady", 5_000))  # assigned 5 s ago
    assert watch.settled(4.0) and not watch.settled(6.0)
    watch.on_stats(_stats("wait-join", 9_000))  # a new round: rebalancing now
    assert not watch.settled(0.0)
    watch.on_stats(_stats("steady", 9_000))  # steady again, but it was rejoining just now
    assert watch.settled(0.0) and not watch.settled(1.0)

    never = GroupWatch()
    never.on_stats(_stats("steady", 0, rebalance_cnt=0))  # steady, never assigned yet
    assert not never.settled(0.5)


def test_an_assignment_between_two_reports_counts_and_so_does_the_time_of_asking():
    watch = GroupWatch()
    watch.on_stats(_stats("steady", 60_000))
    assert watch.settled(30.0)
    watch.on_stats(_stats("steady", 200))  # assigned (or revoked) 0.2 s ago
    assert not watch.settled(1.0) and watch.settled(0.1)
    # Counted from when the member decided to leave, at the earliest.
    assert not watch.settled(0.1, since=time.monotonic())
