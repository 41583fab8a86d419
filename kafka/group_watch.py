"""A member's join state in its consumer group, from librdkafka's statistics.

Why: a member that releases its client without a LeaveGroup (``Reader.close(leave_group=
False)``) must do so only while no join or sync of its own is under way. librdkafka 2.16
destroys such a client by terminating its group handler, and if the group's answer to a
join has just handed the application an assignment to apply (join state
``wait-assign-call``), that handler waits for the call for good: the destroy never returns
and librdkafka's main thread spins at 100% CPU (seen one close in ten at the moment a Tansu
join completed). Between rebalances (``steady``), or before the first join went out
(``init``), nothing is pending: an answer to a join the member sends later needs at least a
JoinGroup and a SyncGroup round trip, and Tansu holds each join for about half the session
timeout.
"""

from __future__ import annotations

import json
import time
from typing import Any

STATS_INTERVAL_MS = 100
"""How often librdkafka reports the member's join state (served by the consumer's poll)."""

QUIET_JOIN_STATES = frozenset({"init", "steady"})
"""Join states with nothing under way for this member (the module doc)."""


class GroupWatch:
    """Keeps the member's join state from the consumer's statistics (its ``stats_cb``)."""

    def __init__(self) -> None:
        self.join_state: str | None = None
        """librdkafka's ``cgrp.join_state`` at the last report (None: no report yet)."""
        self.reported_at: float | None = None
        """Monotonic time of the last report."""

    def settings(self) -> dict[str, Any]:
        """The consumer settings that report here."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_stats}

    def on_stats(self, stats_json: str) -> None:
        cgrp = json.loads(stats_json).get("cgrp")
        if cgrp:
            self.join_state = cgrp.get("join_state")
            self.reported_at = time.monotonic()

    def quiet(self, max_age_s: float = 1.5 * STATS_INTERVAL_MS / 1000) -> bool:
        """Nothing under way for this member, as of a report at most ``max_age_s`` old."""
        return (
            self.join_state in QUIET_JOIN_STATES
            and self.reported_at is not None
            and time.monotonic() - self.reported_at <= max_age_s
        )
