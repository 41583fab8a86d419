"""The per-version rollout budget (docs/design.md, "Versions and the budget").

Per weight version the rollout may start at most

    (1 + staleness_threshold) x trigger_parameter_sync_step x required_samples - num_stale

samples, where ``num_stale`` counts samples generated under older versions and not yet consumed
by the trainer at the sync (queued in Kafka, in flight, or partial). With
``staleness_threshold = 0`` that is exactly ``trigger x required`` per version.

With N workers the version budget is split into N shares (worker i gets one more while
i < budget % N), each worker subtracting its own stale samples, so the sum never exceeds the
budget and nothing but Kafka is shared. At start-up the shares follow the configured
``rollout.num_workers``; from the first sync on, the members the trainer lists in
WeightsPublished (workers come and go): a worker with an id beyond the configured ones that
joins mid-run gets no budget until the next sync, where the shares are recomputed with it.
"""

from __future__ import annotations

from dataclasses import dataclass


def worker_share(total: int, num_workers: int, worker_id: int) -> int:
    """Worker ``worker_id``'s share of ``total`` samples; the shares add up to ``total``."""
    if num_workers <= 0 or not 0 <= worker_id < num_workers:
        raise ValueError(f"worker_id {worker_id} out of range for {num_workers} workers")
    base, extra = divmod(total, num_workers)
    return base + (1 if worker_id < extra else 0)


@dataclass
class RolloutBudget:
    """One worker's budget for the current version; counts admissions, refunds and staleness."""

    max_per_version: int
    num_workers: int = 1
    worker_id: int = 0
    version: int = 0
    allowed: int = 0
    """Samples this worker may start under ``version`` (after subtracting its num_stale)."""
    started: int = 0
    """Samples started under ``version``."""
    num_stale: int = 0

    def reset(self, version: int, num_stale: int, members: list[int] | None = None) -> int:
        """Open the budget of a new version; returns how many samples may be started.

        ``members``: the worker ids sharing this version (from the sync); None: the configured
        ``num_workers``. A worker not among them gets nothing.
        """
        if members is None:
            share = worker_share(self.max_per_version, self.num_workers, self.worker_id)
        elif self.worker_id in members:
            ranked = sorted(set(members))
            share = worker_share(self.max_per_version, len(ranked), ranked.index(self.worker_id))
        else:
            share = 0
        self.version = version
        self.num_stale = max(0, num_stale)
        self.allowed = max(0, share - self.num_stale)
        self.started = 0
        return self.allowed

    @property
    def remaining(self) -> int:
        return max(0, self.allowed - self.started)

    def take(self) -> bool:
        """Admit one sample if the budget allows it."""
        if self.started >= self.allowed:
            return False
        self.started += 1
        return True

    def refund(self, count: int) -> None:
        """``count`` of our samples will not be trained (the trainer dropped them, or they are
        groups dynamic sampling leaves out): allow as many more, so the trainer cannot starve."""
        self.allowed += max(0, count)


def num_stale_at_sync(produced: int, consumed: int, in_flight: int = 0, partial: int = 0) -> int:
    """Samples of this worker generated under older versions and not yet consumed."""
    return max(0, produced - consumed) + in_flight + partial
