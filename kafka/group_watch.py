"""Whether a consumer group is rebalancing, as one member can tell, from librdkafka's statistics.

Why: on Tansu (the embedded broker) a member that leaves a group while it is rebalancing can
wedge the group for good: the rebalance never completes, and the partitions it was moving are
never assigned again (a worker stopped while another joined left the run's prompts unassigned:
the trainer waited for samples until it timed out). A member that is killed (sends no
LeaveGroup) costs only its session timeout. So a member that leaves while the others carry on
first waits until the group has settled (``tests/integration/test_kafka_faults.py``).

A member cannot see the others' state, but every member takes part in every round of a
rebalance: the coordinator answers its next heartbeat with "rebalance in progress" and it
rejoins. So the group has settled, as far as this member can tell, once its own join state has
been ``steady`` and nothing was assigned or revoked for a few heartbeat intervals (``quiet_s``),
counted from when it decided to leave: a rebalance that began just before then reaches it at
its next heartbeat. One that begins in the last moments before its LeaveGroup can still wedge
the group: the window shrinks from the whole rebalance (seconds) to a heartbeat interval.

Why Tansu wedges (its source at the bundled commit, 510f3e2): a group that is forming keeps
its leader, and a LeaveGroup while it is forming removes the member without clearing the
leader; when the leader leaves, no member can ever complete the round (only the leader's
SyncGroup carries the assignment).
"""

from __future__ import annotations

import json
import time
from typing import Any

STATS_INTERVAL_MS = 100
"""How often librdkafka reports the member's join state (served by the consumer's poll)."""


class GroupWatch:
    """Keeps the member's join state from the consumer's statistics (its ``stats_cb``)."""

    def __init__(self) -> None:
        self.join_state: str | None = None
        """librdkafka's ``cgrp.join_state`` at the last report (None: no report yet)."""
        self.unsettled_at: float | None = None
        """Monotonic time the member was last seen rebalancing (None: never seen settled)."""

    def settings(self) -> dict[str, Any]:
        """The consumer settings that report here."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_stats}

    def on_stats(self, stats_json: str) -> None:
        cgrp = json.loads(stats_json).get("cgrp")
        if not cgrp:
            return
        now = time.monotonic()
        self.join_state = cgrp.get("join_state")
        # The last assignment or revocation, even one between two reports.
        changed = now - cgrp.get("rebalance_age", 0) / 1000 if cgrp.get("rebalance_cnt") else now
        if self.join_state != "steady":
            changed = now
        if self.unsettled_at is None or changed > self.unsettled_at:
            self.unsettled_at = changed

    def settled(self, quiet_s: float, since: float = 0.0) -> bool:
        """Steady, and nothing assigned or revoked for ``quiet_s``, counted from ``since`` at
        the earliest (monotonic): a rebalance that began just before ``since`` has reached
        this member by then (see the module doc)."""
        if self.join_state != "steady" or self.unsettled_at is None:
            return False
        return time.monotonic() - max(self.unsettled_at, since) >= quiet_s
