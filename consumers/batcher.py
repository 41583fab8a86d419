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

With ``algorithm.filter_groups.enable`` a group with no signal is settled on arrival, like a
staleness drop (``consumers/dynamic_sampling.py``), and never queued.

A sample whose version is above the trainer's is dropped as invalid: no sync granted it (a
forged or corrupted record; param_version=10**9 was trained as the freshest sample there
is). Every version a worker generates under was the trainer's before any weights left it
(``SyncCoordinator.sync`` sets it before the broadcast), and a restarted trainer takes a
version above the control log's highest before it reads a sample (``take_version_above``),
so no worker's sample is ever above it. A record ``asyncrl replay topic`` copied from
another run (``HEADER_REPLAYED_FROM``) carries that run's versions, and is exempt.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.consumers.dynamic_sampling import REASON as FILTERED
from asyncrl.consumers.dynamic_sampling import no_signal
from asyncrl.kafka import HEADER_REPLAYED_FROM, Record
from asyncrl.schemas.sample import Sample


@dataclass
class Dropped:
    record: Record[Sample]
    reason: str
    kind: str = "max_version_lag"
    """"max_version_lag" or "invalid" (the trainer refunds the worker's budget), "filter_groups"
    (the worker took the slot back itself) or "duplicate" (it cost no budget)."""


@dataclass
class SampleBatcher:
    max_version_lag: int | None = None
    filter_groups: FilterGroupsConfig | None = None
    """Dynamic sampling (``consumers/dynamic_sampling.py``); None: every group is kept."""
    vocab_size: int | None = None
    """The policy's vocabulary: a sample with a token id past it is dropped ("invalid"); the
    update would fail on it at every try (an index error), a restarted trainer too."""
    buffer: deque[Record[Sample]] = field(default_factory=deque)
    read_position: dict[int, int] = field(default_factory=dict)
    """Partition -> offset after the last record offered."""
    consumed: Counter = field(default_factory=Counter)
    """Worker id -> samples settled (trained on or dropped), cumulative: what its worker's
    staleness count subtracts. Not the groups dynamic sampling filters, whose slots their
    worker took back as it published them."""
    dropped: Counter = field(default_factory=Counter)
    """Reason -> samples dropped, cumulative."""
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Sample id -> (partition, offset) of every sample queued or settled."""
    filtered: int = 0
    """Groups filtered by filter_groups, cumulative."""
    taken_filtered: int = 0
    """Groups filtered on the way to the samples of the last ``take``."""
    _filtered_before: deque[int] = field(default_factory=deque)
    """Per queued sample, the groups filtered between it and the queued sample before it."""
    _filtered_trailing: int = 0
    """Groups filtered since the last sample queued."""

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
        newest = rec.value.param_version_end
        if newest > current_version and HEADER_REPLAYED_FROM not in rec.headers:
            self.consumed[rec.value.worker_id] += 1
            self.dropped["invalid"] += 1
            reason = (
                f"param_version {newest} is above the trainer's version {current_version}: "
                "no sync granted it (a forged or corrupted record)"
            )
            return Dropped(rec, reason, kind="invalid")
        if self.filter_groups is not None:
            # Before the lag: its worker took the slot back as it published it (it knows the
            # group has no signal), so it is not counted as consumed, whatever its age.
            why = no_signal(rec.value, self.filter_groups)
            if why is not None:
                self.filtered += 1
                self._filtered_trailing += 1
                return Dropped(rec, why, kind=FILTERED)
        why = self._out_of_vocabulary(rec.value)
        if why is not None:
            self.consumed[rec.value.worker_id] += 1
            self.dropped["invalid"] += 1
            return Dropped(rec, why, kind="invalid")
        lag = current_version - rec.value.param_version
        if self.max_version_lag is not None and lag > self.max_version_lag:
            reason = f"version lag {lag} > max_version_lag {self.max_version_lag}"
            self.consumed[rec.value.worker_id] += 1
            self.dropped["max_version_lag"] += 1
            return Dropped(rec, reason)
        self.buffer.append(rec)
        self._filtered_before.append(self._filtered_trailing)
        self._filtered_trailing = 0
        return None

    def expire(self, current_version: int) -> list[Dropped]:
        """Drop the queued samples ``max_version_lag`` no longer admits at ``current_version``.

        ``offer`` checks the lag as a sample arrives; one queued then waits for its step, and a
        sync in between ages it: with max_version_lag=0, whole steps trained samples a version
        old. Called as each step is assembled, so no sample is trained past the lag. A dropped
        sample's filtered groups go to the sample after it (or to the trailing count)."""
        if self.max_version_lag is None:
            return []
        kept: deque[Record[Sample]] = deque()
        before: deque[int] = deque()
        carried = 0
        out: list[Dropped] = []
        for rec, filtered in zip(self.buffer, self._filtered_before, strict=True):
            lag = current_version - rec.value.param_version
            if lag > self.max_version_lag:
                carried += filtered
                self.consumed[rec.value.worker_id] += 1
                self.dropped["max_version_lag"] += 1
                reason = f"version lag {lag} > max_version_lag {self.max_version_lag} (queued)"
                out.append(Dropped(rec, reason))
                continue
            kept.append(rec)
            before.append(filtered + carried)
            carried = 0
        self.buffer, self._filtered_before = kept, before
        self._filtered_trailing += carried
        return out

    def _out_of_vocabulary(self, sample: Sample) -> str | None:
        if self.vocab_size is None:
            return None
        ids = [sample.prompt_ids, *(t.response_ids for t in sample.trajectories)]
        top = max((int(np.max(a)) for a in ids if len(a)), default=0)
        if top >= self.vocab_size:
            return f"token id {top} outside the policy's vocabulary ({self.vocab_size} ids)"
        return None

    def __len__(self) -> int:
        return len(self.buffer)

    def take(self, n: int) -> list[Record[Sample]]:
        """The ``n`` oldest queued samples; they count as consumed from now on."""
        if len(self.buffer) < n:
            raise ValueError(f"only {len(self.buffer)} samples queued, {n} requested")
        batch = [self.buffer.popleft() for _ in range(n)]
        self.taken_filtered = sum(self._filtered_before.popleft() for _ in range(n))
        for rec in batch:
            self.consumed[rec.value.worker_id] += 1
        return batch

    def filtered_ahead(self, n: int) -> int:
        """Groups filtered on the way to the next ``n`` samples (those queued so far)."""
        ahead = sum(list(self._filtered_before)[:n])
        return ahead + (self._filtered_trailing if len(self.buffer) < n else 0)

    def settled_offsets(self) -> dict[int, int]:
        """Per partition, the first offset not yet settled: where a restart must resume."""
        offsets = dict(self.read_position)
        for rec in self.buffer:
            offsets[rec.partition] = min(offsets.get(rec.partition, rec.offset), rec.offset)
        return offsets

    def state(self) -> dict:
        # Every checkpoint holds every settled id: a copy of ``seen`` (at C speed) less the few
        # queued ids, not a test of each id against the queue (seen x buffer per save: the
        # trainer slowed down as a long run went on).
        settled = dict(self.seen)
        for sid in self._queued():
            settled.pop(sid, None)
        state: dict[str, Any] = {
            "offsets": {str(p): o for p, o in self.settled_offsets().items()},
            "consumed": {str(w): c for w, c in self.consumed.items()},
            "dropped": dict(self.dropped),
            "settled": settled,
        }
        if self.filter_groups is not None or self.filtered:
            # a restart re-reads the queued samples, not the filtered ones between them (those
            # are settled): their count goes to the first sample queued again
            state["filtered"] = self.filtered
            unattributed = sum(self._filtered_before) + self._filtered_trailing
            state["filtered_unattributed"] = unattributed
        return state

    def _queued(self) -> set[str]:
        return {rec.value.sample_id for rec in self.buffer}

    def restore(self, state: dict) -> dict[int, int]:
        """Load counters from a checkpoint; returns the offsets to seek to."""
        self.consumed = Counter({int(w): c for w, c in state.get("consumed", {}).items()})
        self.dropped = Counter(state.get("dropped", {}))
        self.filtered = int(state.get("filtered", 0))
        self._filtered_trailing = int(state.get("filtered_unattributed", 0))
        self._filtered_before.clear()
        self.seen = {sid: (p, o) for sid, (p, o) in state.get("settled", {}).items()}
        offsets = {int(p): o for p, o in state.get("offsets", {}).items()}
        self.read_position = dict(offsets)
        self.buffer.clear()
        return offsets
