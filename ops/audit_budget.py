"""The audit's budget check: no version starts more samples than the log allows it
(docs/design.md, "The budget check")."""

from __future__ import annotations

from collections import Counter

from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.consumers.dynamic_sampling import no_signal
from asyncrl.ops.audit_log import _of
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import PartialSample
from asyncrl.schemas.sample import Sample


def budget_allowance(
    control: list[ev.ControlEvent],
    partials: list[PartialSample],
    max_samples_per_version: int,
    taken_back: Counter[int] | None = None,
    partial_rollout: bool = False,
) -> Counter[int]:
    """Per version, the most samples the workers may have started under it, from the log.

    A worker incarnation opens a version's budget with RolloutResumed(budget): its share of
    ``max_samples_per_version`` minus its stale samples (a restarted worker opens it again,
    so each opening counts). Beyond that a worker starts only what it gets back:
    BudgetGranted(v); the trainer's SamplesDropped with a target worker, which reaches it
    under the version the trainer was at or the one before, or the one it has requested since;
    and, unlogged, the refund of the
    samples in flight whose prompt partition moved to another worker. That one is bounded
    from the log. In mode (c) (no partial on the log) a moved sample restarts elsewhere as a
    new sample, so its slot is spent once. In mode (d) the refund may be of a sample in flight
    since an older version (at most the opening's ``num_stale``; a sample cut at a sync before
    its first token also counts under the next version, and is among these), or of one whose
    logged partial another worker continues under a later version (at most the partials a
    worker logged under v beyond those its RolloutPaused counted at the sync). And, with dynamic
    sampling, ``taken_back``: per version, the slots of the groups with no signal that workers
    published under it (``slots_taken_back``). ``partial_rollout``: the run is in mode (d), where
    a sample admitted under v that gets its first token under v+1 counts under v+1; with
    ``in_flight_update`` no partial reaches the log to say so (a slow interaction or tool keeps
    the engine's slots, and samples admitted just before a swap start after it).
    """
    allowed: Counter[int] = Counter()
    for e in _of(control, ev.RolloutResumed):
        allowed[e.version] += min(e.budget, max_samples_per_version)
        if partials or partial_rollout:
            allowed[e.version] += e.num_stale
    for e in _of(control, ev.BudgetGranted):
        allowed[e.version] += e.count
    allowed.update(taken_back or Counter())
    requested = -1
    for e in control:
        if isinstance(e, ev.SyncRequested):
            requested = max(requested, e.version)
        # The trainer's drops refund their worker (a duplicate's refunds nobody); a worker's
        # own, at the run's end, refund nothing. One logged after the trainer requested its
        # next version is that version's (producers/control_inbox.py, ``_refund``).
        elif isinstance(e, ev.SamplesDropped) and e.worker == ev.TRAINER and e.target_worker >= 0:
            allowed[e.version] += e.count
            allowed[e.version - 1] += e.count
            if requested > e.version:
                allowed[requested] += e.count
    if partials:
        logged = Counter((p.sample.worker_id, p.interrupted_at_version) for p in partials)
        at_sync: Counter[tuple[int, int]] = Counter()
        for e in _of(control, ev.RolloutPaused):
            at_sync[(e.worker, e.version - 1)] += e.n_partial
        for (worker, version), n in logged.items():
            allowed[version] += max(0, n - at_sync[(worker, version)])
    return allowed


def _distinct(samples: list[Sample]) -> list[Sample]:
    """Each sample id once, as its first record on the log holds it."""
    return list({s.sample_id: s for s in reversed(samples)}.values())


def started_per_version(samples: list[Sample]) -> Counter[int]:
    """Distinct samples per the version their generation started under: a worker takes a
    budget slot when it admits a prompt, and a partial rollout's sample spans versions, so it
    counts under its earliest (``Sample.param_version``)."""
    return Counter(s.param_version for s in _distinct(samples))


def slots_taken_back(samples: list[Sample], filters: FilterGroupsConfig | None) -> Counter[int]:
    """Per version, the groups with no signal published under it: with dynamic sampling their
    worker takes each one's slot back as it publishes it, at the version it is at. That is its
    last token's (``Sample.param_version_end``), or the next one for an agent trajectory whose
    last tool result came back after a sync and ended it: both are allowed, as the trainer's
    refunds are under the two versions they may reach a worker at."""
    if filters is None:
        return Counter()
    flat = [s.param_version_end for s in _distinct(samples) if no_signal(s, filters) is not None]
    return Counter(flat) + Counter(v + 1 for v in flat)


def over_budget_versions(
    samples: list[Sample],
    partials: list[PartialSample],
    control: list[ev.ControlEvent],
    max_samples_per_version: int,
    filters: FilterGroupsConfig | None = None,
    partial_rollout: bool = False,
) -> list[str]:
    """Versions under which more samples started than ``budget_allowance`` allows. Only
    published samples are counted (a lower bound of what started). A log with no
    RolloutResumed has no worker budget to check (samples replayed in from another run).
    ``filters``: the run's dynamic sampling (``RunConfig.filters_groups``);
    ``partial_rollout``: the run's ``async_training.partial_rollout``."""
    if not _of(control, ev.RolloutResumed):
        return []
    taken_back = slots_taken_back(samples, filters)
    allowed = budget_allowance(
        control, partials, max_samples_per_version, taken_back, partial_rollout
    )
    return [
        f"version {v}: {n} samples started, at most {allowed[v]} allowed"
        for v, n in sorted(started_per_version(samples).items())
        if n > allowed[v]
    ]
