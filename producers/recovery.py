"""What a (re)starting rollout worker learns from the log before it takes a prompt.

A worker killed mid-run leaves three kinds of work behind, all recoverable from Kafka:
- prompts it had taken but not finished: their offsets were never committed (the prompt source
  commits only past prompts whose sample is acknowledged), so the group redelivers them;
- prompts whose sample it had published, but whose offset sat behind an earlier unfinished
  prompt: redelivered too, and must *not* be generated again (``published``);
- samples interrupted at a sync in mode (d): the newest record per sample id on ``partials``
  holds every trajectory so far, to be continued rather than restarted (``partials``).

The index also counts each worker's published samples, since a worker's staleness count
(``produced - consumed``) must include what its previous incarnation produced (and leave out,
as the trainer does, the groups dynamic sampling filters: ``no_signal``).

Scanning the whole ``samples`` topic decodes each record as the trainer does (~0.1-0.2 ms a
group): only a sample the trainer will take counts as published. Keys and headers alone let a
record that does not decode (dead-lettered by the trainer) stand for its sample id, whose
prompt a restarted worker then skipped for good, and a malformed worker header stopped every
restarted worker. It is one pass over the run's log at start-up. Later scans (at each new
prompt assignment, when workers come and go) read only what was appended since the last one
(``positions``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from asyncrl.kafka.records import LogScan
from asyncrl.schemas.codec import DecodeError
from asyncrl.schemas.partial import PartialSample, decode_partial
from asyncrl.schemas.sample import NO_SIGNAL_HEADER, decode_sample

log = logging.getLogger(__name__)


@dataclass
class RecoveryIndex:
    published: set[str] = field(default_factory=set)
    """Sample ids already on ``samples``."""
    produced: Counter[int] = field(default_factory=Counter)
    """Samples on ``samples`` per producing worker id."""
    no_signal: Counter[int] = field(default_factory=Counter)
    """Of those, the groups dynamic sampling leaves out (``NO_SIGNAL_HEADER``): their worker
    took their budget slots back, so its staleness count leaves them out."""
    partials: dict[str, PartialSample] = field(default_factory=dict)
    """The newest partial record of every sample not (yet) on ``samples``."""
    skipped: int = 0
    """Redelivered prompts whose sample was already published (not generated again)."""
    resumed: int = 0
    """Logged partial samples continued by this worker."""
    positions: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per topic, the next offset of each partition to scan."""

    @classmethod
    def from_log(
        cls, scan: LogScan, after: dict[str, dict[int, int]] | None = None
    ) -> RecoveryIndex:
        """The index of the log, or of what it holds past ``after`` (an earlier ``positions``)."""
        index = cls()
        after = after or {}
        for rec in scan("samples", after.get("samples")):
            index._advance("samples", rec.partition, rec.offset)
            try:
                sample = decode_sample(rec.value, rec.headers)
            except DecodeError as err:  # the trainer dead-letters it: nothing was published
                log.warning("samples offset %d does not decode, not counted: %s", rec.offset, err)
                continue
            index.published.add(sample.sample_id)
            index.produced[sample.worker_id] += 1
            if NO_SIGNAL_HEADER in rec.headers:
                index.no_signal[sample.worker_id] += 1
        for rec in scan("partials", after.get("partials")):
            index._advance("partials", rec.partition, rec.offset)
            if rec.key is None or rec.key in index.published:
                continue
            try:
                index.partials[rec.key] = decode_partial(rec.value, rec.headers)  # newest wins
            except DecodeError as err:
                log.warning("partials offset %d does not decode, skipped: %s", rec.offset, err)
        return index

    def _advance(self, topic: str, partition: int, offset: int) -> None:
        self.positions.setdefault(topic, {})[partition] = offset + 1

    def rescan(self, scan: LogScan) -> None:
        """Take in what was appended to the log since the last scan."""
        self.merge(RecoveryIndex.from_log(scan, after=self.positions))

    def merge(self, newer: RecoveryIndex) -> None:
        """Take in a later scan of the log (other workers' samples and partials): a sample
        published since drops its partial, a newer partial replaces an older one."""
        self.published |= newer.published
        for sample_id in newer.published:
            self.partials.pop(sample_id, None)
        for sample_id, partial in newer.partials.items():
            if sample_id not in self.published:
                self.partials[sample_id] = partial
        for topic, offsets in newer.positions.items():
            self.positions.setdefault(topic, {}).update(offsets)

    def log_found(self, worker_id: int) -> None:
        """Say what a (re)starting worker found on the log, if anything."""
        if self.published or self.partials:
            log.info(
                "worker %d: the log holds %d samples (%d of this worker) and %d unfinished "
                "partial samples",
                *(worker_id, len(self.published), self.produced[worker_id], len(self.partials)),
            )

    def partials_of(self, worker_id: int) -> int:
        """Logged partial samples of ``worker_id`` not yet continued: work its previous
        incarnation admitted under older versions, which the budget counts as stale."""
        return sum(1 for p in self.partials.values() if p.sample.worker_id == worker_id)

    def take_partial(self, sample_id: str) -> PartialSample | None:
        """The logged partial of ``sample_id`` to continue, once (None: start it afresh)."""
        partial = self.partials.pop(sample_id, None)
        if partial is not None:
            self.resumed += 1
        return partial

    def already_published(self, sample_id: str) -> bool:
        if sample_id in self.published:
            self.skipped += 1
            return True
        return False
