"""The trainer's side of the staleness bound: what it trains never exceeds what
``async_training.staleness_threshold`` promises, whatever happened before (docs/design.md,
"The bound at every window").

The workers' budgets keep the bound in a run with no faults. Some faults put more stale
samples on the log than a window may train: a sync off the cadence (a worker that joins after
an update gets a new version at once) ends a window early, and the budget a worker opened for
a whole window is left over to the next; a trainer that died past its checkpoint leaves
samples of weights no trainer holds any more (a dead branch of the version lineage). So the
trainer screens the samples it is about to train, oldest first, and drops:

- a sample whose lag on the lineage (``consumers/lineage.py``) is above
  ``ceil(staleness_threshold)``: its true distance, a dead branch's depth included;
- a stale sample (lag >= 1) once its window has trained
  ``max_samples_per_version - samples_per_version`` stale samples.

Each drop is a ``SamplesDropped`` with its reason, and refunds its worker, which generates a
fresh sample in its place. A sample of a version the log does not hold (replayed in from
another run) is not screened.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from asyncrl.config import RunConfig
from asyncrl.consumers.batcher import Dropped, SampleBatcher
from asyncrl.consumers.lineage import Lineage
from asyncrl.kafka import Record
from asyncrl.schemas.sample import Sample

KIND = "staleness"
"""``Dropped.kind`` of the guard's drops (refunded, as ``max_version_lag``'s are)."""


class StalenessGuard:
    def __init__(self, cfg: RunConfig) -> None:
        threshold = cfg.async_training.staleness_threshold
        self.max_lag = math.ceil(threshold)
        """The most syncs a trained sample may be behind the trainer's weights."""
        self.max_stale = max(0, cfg.max_samples_per_version - cfg.samples_per_version)
        """The most stale samples one window may train."""
        self.lineage = Lineage()
        self.window: tuple[int, int] = (-1, 0)
        """(the trainer's version, stale samples trained under it so far)."""

    def lag(self, sample: Sample, version: int) -> int | None:
        return self.lineage.lag(sample.param_version, version)

    def screen(self, batcher: SampleBatcher, n: int, version: int) -> list[Dropped]:
        """Drop, from the front of the queue, what the next ``n`` samples trained under
        ``version`` may not include (module docstring); returns the drops to report."""
        stale = self._stale_so_far(version)
        kept = 0
        refused: dict[int, tuple[str, str]] = {}
        for i, rec in enumerate(batcher.buffer):
            if kept == n:
                break
            lag = self.lag(rec.value, version)
            if lag is not None and lag > self.max_lag:
                refused[i] = (
                    KIND,
                    f"lag {lag} on the version lineage > {self.max_lag} (staleness_threshold)",
                )
                continue
            if lag is not None and lag >= 1:
                if stale >= self.max_stale:
                    refused[i] = (
                        KIND,
                        f"version {version}'s window has trained its {self.max_stale} stale "
                        "samples (staleness_threshold)",
                    )
                    continue
                stale += 1
            kept += 1
        return batcher.drop_queued(refused)

    def trained(self, batch: Iterable[Record[Sample]], version: int) -> None:
        """Count the stale samples of a step taken under ``version``."""
        stale = self._stale_so_far(version)
        for rec in batch:
            lag = self.lag(rec.value, version)
            if lag is not None and lag >= 1:
                stale += 1
        self.window = (version, stale)

    def _stale_so_far(self, version: int) -> int:
        at, stale = self.window
        return stale if at == version else 0
