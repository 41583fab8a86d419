"""Turns the ``samples`` stream into training batches, applying the staleness filter.

Samples are used first-in first-out, so within a partition every sample of a finished step
comes before every sample still waiting. The checkpoint therefore stores one offset per
partition, the first sample not yet settled (trained on or dropped), and a restarted trainer
that seeks there consumes each sample exactly once across the restart.

Sample ids are unique on the log (one per prompt and epoch), so a second record with an id
already queued or settled is a duplicate (a copy replayed into the topic, a producer's retry
after a lost acknowledgement): it is dropped, counted, and not counted as consumed, since its
worker did not spend budget on it. A record re-read at the same coordinates after a restart
(a drop settled behind a queued sample) is the same record, skipped without a count.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from asyncrl.kafka import Record
from asyncrl.schemas.sample import Sample


@dataclass
class Dropped:
    record: Record[Sample]
    reason: str
    kind: str = "max_version_lag"
    """"max_version_lag" (the worker may refill its budget) or "duplicate" (it may not)."""


@dataclass
class SampleBatcher:
    max_version_lag: int | None = None
    buffer: deque[Record[Sample]] = field(default_factory=deque)
    read_position: dict[int, int] = field(default_factory=dict)
    """Partition -> offset after the last record offered."""
    consumed: Counter = field(default_factory=Counter)
    """Worker id -> samples settled (trained on or dropped), cumulative."""
    dropped: Counter = field(default_factory=Counter)
    """Reason -> samples dropped, cumulative."""
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Sample id -> (partition, offset) of every sample queued or settled."""

    def offer(self, rec: Record[Sample], current_version: int) -> Dropped | None:
        """Queue a sample for training, or drop it (returned, so the caller can report it)."""
        self.read_position[rec.partition] = rec.offset + 1
        sample_id = rec.value.sample_id
        first = self.seen.get(sample_id)
        if first == (rec.partition, rec.offset):
            return None  # re-read after a restart: settled already
        if first is not None:
            self.dropped["duplicate"] += 1
            reason = f"duplicate of the sample at partition {first[0]} offset {first[1]}"
            return Dropped(rec, reason, kind="duplicate")
        self.seen[sample_id] = (rec.partition, rec.offset)
        lag = current_version - rec.value.param_version
        if self.max_version_lag is not None and lag > self.max_version_lag:
            reason = f"version lag {lag} > max_version_lag {self.max_version_lag}"
            self.consumed[rec.value.worker_id] += 1
            self.dropped["max_version_lag"] += 1
            return Dropped(rec, reason)
        self.buffer.append(rec)
        return None

    def __len__(self) -> int:
        return len(self.buffer)

    def take(self, n: int) -> list[Record[Sample]]:
        """The ``n`` oldest queued samples; they count as consumed from now on."""
        if len(self.buffer) < n:
            raise ValueError(f"only {len(self.buffer)} samples queued, {n} requested")
        batch = [self.buffer.popleft() for _ in range(n)]
        for rec in batch:
            self.consumed[rec.value.worker_id] += 1
        return batch

    def settled_offsets(self) -> dict[int, int]:
        """Per partition, the first offset not yet settled: where a restart must resume."""
        offsets = dict(self.read_position)
        for rec in self.buffer:
            offsets[rec.partition] = min(offsets.get(rec.partition, rec.offset), rec.offset)
        return offsets

    def state(self) -> dict:
        return {
            "offsets": {str(p): o for p, o in self.settled_offsets().items()},
            "consumed": {str(w): c for w, c in self.consumed.items()},
            "dropped": dict(self.dropped),
            "settled": {
                sid: list(where) for sid, where in self.seen.items() if sid not in self._queued()
            },
        }

    def _queued(self) -> set[str]:
        return {rec.value.sample_id for rec in self.buffer}

    def restore(self, state: dict) -> dict[int, int]:
        """Load counters from a checkpoint; returns the offsets to seek to."""
        self.consumed = Counter({int(w): c for w, c in state.get("consumed", {}).items()})
        self.dropped = Counter(state.get("dropped", {}))
        self.seen = {sid: (p, o) for sid, (p, o) in state.get("settled", {}).items()}
        offsets = {int(p): o for p, o in state.get("offsets", {}).items()}
        self.read_position = dict(offsets)
        self.buffer.clear()
        return offsets
