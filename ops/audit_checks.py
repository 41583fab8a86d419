"""The audit's exactly-once checks: every prompt ends as one sample, every sample is trained
once, every version names one set of weights, every sync ends. Pure functions over decoded
records; each returns the offending items, one per violation counted."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from asyncrl.ops.audit_log import _extra_copies, _of, dropped_ids, run_finished
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import PartialSample
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import Sample
from asyncrl.schemas.step import StepRecord


def duplicate_samples(samples: list[Sample]) -> list[str]:
    """Sample ids are one per prompt and epoch: a second record of one is a duplicate (the
    trainer skips it, but a producer or a replay wrote it)."""
    return _extra_copies(s.sample_id for s in samples)


def duplicate_prompts(prompts: list[PromptRecord]) -> list[str]:
    """The feed writes each prompt of an epoch once; the same prompt id in two epochs is two
    prompts (two sample ids), so copies are counted by sample id."""
    return _extra_copies(p.sample_id for p in prompts)


def void_steps(steps: list[StepRecord], control: list[ev.ControlEvent]) -> list[bool]:
    """Which step records a trainer restart voided: records numbered above the checkpoint the
    trainer resumed from, written before it resumed (TrainerResumed), or followed on the log
    by a record whose number is not above theirs (the restarted trainer's own numbering)."""
    resumed = [(e.ts, e.step) for e in control if isinstance(e, ev.TrainerResumed)]
    void = [False] * len(steps)
    lowest_after: float = float("inf")
    for i in range(len(steps) - 1, -1, -1):
        s = steps[i]
        void[i] = lowest_after <= s.step or any(s.step > at and s.ts < ts for ts, at in resumed)
        lowest_after = min(lowest_after, s.step)
    return void


def trained_twice(steps: list[StepRecord], control: list[ev.ControlEvent]) -> list[str]:
    """Each sample is trained on exactly once, across trainer restarts: every use of a sample
    id beyond its first, over the step records in force (twice in one record counts too)."""
    void = void_steps(steps, control)
    return _extra_copies(
        sid for s, v in zip(steps, void, strict=True) if not v for sid in s.sample_ids
    )


def trained_missing(steps: list[StepRecord], samples: list[Sample]) -> list[str]:
    """A step trained on what the log must hold: ids named by any step record (void ones too)
    that are not on ``samples``."""
    on_log = {s.sample_id for s in samples}
    named = dict.fromkeys(sid for s in steps for sid in s.sample_ids)
    return [sid for sid in named if sid not in on_log]


def lost_prompts(
    committed: set[str], samples: list[Sample], control: list[ev.ControlEvent]
) -> list[str]:
    """A worker commits a prompt only once its sample is acknowledged, so every committed
    prompt must be a sample on the log, or a sample some SamplesDropped names."""
    accounted = {s.sample_id for s in samples} | dropped_ids(control)
    return sorted(committed - accounted)


def reused_versions(control: list[ev.ControlEvent]) -> list[str]:
    """One version, one set of weights: versions whose WeightsPublished events carry two or
    more different checksums (empty ones, sync.verify_checksum=false, say nothing)."""
    sums: dict[int, set[str]] = defaultdict(set)
    for e in _of(control, ev.WeightsPublished):
        if e.checksum:
            sums[e.version].add(e.checksum)
    return [f"version {v}: {len(c)} checksums" for v, c in sorted(sums.items()) if len(c) > 1]


def mismatched_weights(control: list[ev.ControlEvent]) -> list[str]:
    """A worker that loaded a version whose bytes differ from what the trainer published
    (``WeightsLoaded.checksum_ok`` false) generated that version's samples from other weights."""
    return [
        f"worker {e.worker}, version {e.version}"
        for e in _of(control, ev.WeightsLoaded)
        if not e.checksum_ok
    ]


def version_regressions(control: list[ev.ControlEvent]) -> list[str]:
    """Versions only grow, in log order: a SyncRequested (or a restarted trainer's version)
    must be above every version requested or published before it; a WeightsPublished (a sync,
    or a join repeating the current version) must not be below an earlier one."""
    out = []
    highest = published = -1
    for i, e in enumerate(control):
        if isinstance(e, ev.SyncRequested | ev.TrainerResumed):
            if e.version <= highest:
                out.append(f"{type(e).__name__}({e.version}) after version {highest} (#{i})")
            highest = max(highest, e.version)
        elif isinstance(e, ev.WeightsPublished):
            if e.version < published:
                out.append(f"WeightsPublished({e.version}) after version {published} (#{i})")
            published = max(published, e.version)
            highest = max(highest, e.version)
    return out


@dataclass
class SyncOutcomes:
    complete: list[int] = field(default_factory=list)
    incomplete: list[int] = field(default_factory=list)
    """Requested, never published, and the trainer requested another sync after it."""
    in_progress: list[int] = field(default_factory=list)
    """The last sync requested, not published yet: the run is going, or it finished (or its
    trainer died) during that sync."""
    abandoned: list[int] = field(default_factory=list)
    """Cut by the trainer's death: a restarted trainer (TrainerResumed) came next."""


def sync_outcomes(control: list[ev.ControlEvent]) -> SyncOutcomes:
    """Every SyncRequested(v) ends in a WeightsPublished(v) after it, unless the trainer died
    or the run ended during it."""
    out = SyncOutcomes()
    published_at: dict[int, int] = {}  # version -> position of its last WeightsPublished
    for i, e in enumerate(control):
        if isinstance(e, ev.WeightsPublished):
            published_at[e.version] = i
    nxt: ev.ControlEvent | None = None  # the next SyncRequested or TrainerResumed
    for i in range(len(control) - 1, -1, -1):
        e = control[i]
        if isinstance(e, ev.SyncRequested):
            if published_at.get(e.version, -1) > i:
                out.complete.append(e.version)
            elif nxt is None:
                out.in_progress.append(e.version)
            elif isinstance(nxt, ev.TrainerResumed):
                out.abandoned.append(e.version)
            else:
                out.incomplete.append(e.version)
        if isinstance(e, ev.SyncRequested | ev.TrainerResumed):
            nxt = e
    for versions in (out.complete, out.incomplete, out.in_progress, out.abandoned):
        versions.reverse()
    return out


def open_partials(
    partials: list[PartialSample], samples: list[Sample], control: list[ev.ControlEvent]
) -> list[str]:
    """Partial samples with no sample on the log and no SamplesDropped naming them."""
    accounted = {s.sample_id for s in samples} | dropped_ids(control)
    ids = dict.fromkeys(p.sample.sample_id for p in partials)
    return [sid for sid in ids if sid not in accounted]


def unfinished_partials(
    partials: list[PartialSample],
    samples: list[Sample],
    control: list[ev.ControlEvent],
    committed: set[str],
) -> list[str]:
    """Once the run has finished, every logged partial whose prompt the rollout group has
    committed was continued to a sample or dropped by its worker at the end. One whose prompt
    is not committed was handed back to the group (its worker left) and waits there like any
    prompt not taken yet; while the run goes on (or after a crash) any may still be
    continued: ``open_partials`` then, not a violation."""
    if not run_finished(control):
        return []
    return [sid for sid in open_partials(partials, samples, control) if sid in committed]
