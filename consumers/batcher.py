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

What that takes, kept in memory bounded by the dataset and the queue, not by the run's length:
every settled id, exactly (``SettledIds``: a per-prompt epoch watermark); the coordinates of
the queued ids; and the coordinates of the settled ids a restart could read again, those at
or past their partition's settled offset (a restart seeks there, never below). Settled
offsets only grow, so an id whose offset they have passed keeps its membership and loses its
coordinates: a copy of it is still a duplicate, named without the first one's offset.

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
from asyncrl.consumers.settled import SettledIds
from asyncrl.kafka import HEADER_REPLAYED_FROM, Record
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample


@dataclass
class Dropped:
    record: Record[Sample]
    reason: str
    kind: str = "max_version_lag"
    """"max_version_lag", "staleness" or "invalid" (the trainer refunds the worker's budget),
    "filter_groups" (the worker took the slot back itself) or "duplicate" (it cost no
    budget)."""

    def event(self, run_id: str, version: int) -> ev.SamplesDropped:
        """The SamplesDropped the trainer publishes: addressed to the sample's worker where it
        refunds that worker's budget, to the trainer where it does not (a duplicate cost no
        budget; a filtered group's worker took its slot back as it published it)."""
        sample = self.record.value
        refunds = self.kind not in ("duplicate", FILTERED)
        return ev.SamplesDropped(
            run_id=run_id,
            version=version,
            target_worker=sample.worker_id if refunds else ev.TRAINER,
            count=1,
            reason=self.reason,
            sample_ids=[sample.sample_id],
        )


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
    settled: SettledIds = field(default_factory=SettledIds)
    """Every sample id trained on or dropped (not the duplicates)."""
    queued_at: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Sample id -> (partition, offset) of each queued sample."""
    settled_at: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Sample id -> (partition, offset) of each settled sample a restart could read again:
    at or past its partition's settled offset (pruned as those pass it)."""
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
        at = (rec.partition, rec.offset)
        first = self.queued_at.get(sample_id) or self.settled_at.get(sample_id)
        if first == at:
            return None  # re-read after a restart: settled already
        if first is not None or sample_id in self.settled:
            self.dropped["duplicate"] += 1
            reason = (
                f"duplicate of the sample at partition {first[0]} offset {first[1]}"
                if first is not None
                else "duplicate of a sample settled earlier (its offset no longer kept)"
            )
            return Dropped(rec, reason, kind="duplicate")
        newest = rec.value.param_version_end
        if newest > current_version and HEADER_REPLAYED_FROM not in rec.headers:
            self._settle(sample_id, at)
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
                self._settle(sample_id, at)
                self.filtered += 1
                self._filtered_trailing += 1
                return Dropped(rec, why, kind=FILTERED)
        why = self._out_of_vocabulary(rec.value)
        if why is not None:
            self._settle(sample_id, at)
            self.consumed[rec.value.worker_id] += 1
            self.dropped["invalid"] += 1
            return Dropped(rec, why, kind="invalid")
        lag = current_version - rec.value.param_version
        if self.max_version_lag is not None and lag > self.max_version_lag:
            self._settle(sample_id, at)
            reason = f"version lag {lag} > max_version_lag {self.max_version_lag}"
            self.consumed[rec.value.worker_id] += 1
            self.dropped["max_version_lag"] += 1
            return Dropped(rec, reason)
        self.queued_at[sample_id] = at
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
                self._settle(rec.value.sample_id, self.queued_at.pop(rec.value.sample_id))
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

    def drop_queued(self, reasons: dict[int, tuple[str, str]]) -> list[Dropped]:
        """Drop the queued samples at these positions of the queue (-> (kind, reason)), as
        ``expire`` drops those past the lag: settled, counted as consumed (their worker is
        refunded), their filtered groups carried to the sample after them."""
        if not reasons:
            return []
        kept: deque[Record[Sample]] = deque()
        before: deque[int] = deque()
        carried = 0
        out: list[Dropped] = []
        for i, (rec, filtered) in enumerate(zip(self.buffer, self._filtered_before, strict=True)):
            if i in reasons:
                kind, reason = reasons[i]
                self._settle(rec.value.sample_id, self.queued_at.pop(rec.value.sample_id))
                carried += filtered
                self.consumed[rec.value.worker_id] += 1
                self.dropped[kind] += 1
                out.append(Dropped(rec, reason, kind=kind))
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
            sample_id = rec.value.sample_id
            del self.queued_at[sample_id]
            self.settled.add(sample_id)  # below its partition's settled offset now: no place
        self._forget_passed()
        return batch

    def _settle(self, sample_id: str, at: tuple[int, int]) -> None:
        """A dropped sample: settled, its place kept while a restart could read it again."""
        self.settled.add(sample_id)
        self.settled_at[sample_id] = at

    def _forget_passed(self) -> None:
        """Drop the places of settled ids below their partition's settled offset: a restart
        seeks there or later (the offsets only grow), so it never reads them again."""
        offsets = self.settled_offsets()
        passed = [s for s, (p, o) in self.settled_at.items() if o < offsets.get(p, 0)]
        for sample_id in passed:
            del self.settled_at[sample_id]

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
        # Every settled id, compactly (``SettledIds``), and the places a restart needs: the
        # settled ids at or past the offsets it will seek to (the queued ones are read again).
        self._forget_passed()
        state: dict[str, Any] = {
            "offsets": {str(p): o for p, o in self.settled_offsets().items()},
            "consumed": {str(w): c for w, c in self.consumed.items()},
            "dropped": dict(self.dropped),
            "settled_ids": self.settled.state(),
            "settled_at": dict(self.settled_at),
        }
        if self.filter_groups is not None or self.filtered:
            # a restart re-reads the queued samples, not the filtered ones between them (those
            # are settled): their count goes to the first sample queued again
            state["filtered"] = self.filtered
            unattributed = sum(self._filtered_before) + self._filtered_trailing
            state["filtered_unattributed"] = unattributed
        return state

    def restore(self, state: dict) -> dict[int, int]:
        """Load counters from a checkpoint; returns the offsets to seek to."""
        self.consumed = Counter({int(w): c for w, c in state.get("consumed", {}).items()})
        self.dropped = Counter(state.get("dropped", {}))
        self.filtered = int(state.get("filtered", 0))
        self._filtered_trailing = int(state.get("filtered_unattributed", 0))
        self._filtered_before.clear()
        offsets = {int(p): o for p, o in state.get("offsets", {}).items()}
        self.settled = SettledIds.from_state(state.get("settled_ids", {}))
        self.settled_at = {sid: (p, o) for sid, (p, o) in state.get("settled_at", {}).items()}
        self.queued_at.clear()
        self.read_position = dict(offsets)
        self.buffer.clear()
        return offsets


def starved(batcher: SampleBatcher, n: int, topic: str, timeout_s: float) -> TimeoutError:
    """The error of a step whose ``n`` samples did not arrive within ``sync.timeout_s``,
    saying the likely why: no worker running, or dynamic sampling that filtered the feed dry."""
    why = "are the rollout workers running?"
    if batcher.filtered:
        why = (
            f"dynamic sampling has filtered {batcher.filtered} groups so far: the prompt feed "
            "may have run dry (set algorithm.filter_groups.max_num_gen_batches)"
        )
    return TimeoutError(
        f"only {len(batcher)} of {n} samples arrived on {topic} within {timeout_s:.0f} s "
        f"(sync.timeout_s): {why}"
    )
