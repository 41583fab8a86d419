"""``asyncrl audit``: read a run's log back and check the invariants the design promises.

Run it first after a crash. The checks are pure functions
over decoded records (a :class:`RunLog`), so they are tested without a broker; ``read_run_log``
is the thin part that reads the topics. Each check returns the offending items, one per
violation counted, so a count comes with examples to look up (``asyncrl inspect``).

A violation is something a correct run never shows, whatever crashed and restarted. What a
run that is still going (or that a crash stopped mid-way) legitimately leaves open, a sync
pending or a partial sample not continued yet, is reported apart and is not a violation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from asyncrl.config import RunConfig
from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.consumers.dynamic_sampling import no_signal
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import PartialSample
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import Sample
from asyncrl.schemas.step import StepRecord

VIOLATIONS: dict[str, str] = {
    "duplicate_samples": "extra copies of a sample id on samples",
    "duplicate_prompts": "extra copies of a prompt (same prompt id and epoch) on prompts",
    "trained_twice": "extra uses of a sample id by the step records in force",
    "trained_missing": "sample ids a step record names that are not on samples",
    "lost_prompts": "prompts the rollout group committed with no sample and no logged drop",
    "reused_versions": "versions published with two or more different weight checksums",
    "mismatched_weights": "weight loads whose checksum differed from the trainer's",
    "version_regressions": "syncs or weights published with a version not above earlier ones",
    "incomplete_syncs": "SyncRequested(v) with no WeightsPublished(v), and the trainer moved on",
    "over_budget_versions": "versions under which more samples started than their budget",
    "unfinished_partials": "partial samples of a finished run neither finished nor dropped",
}
"""Every check, in report order, with what its count counts. The audit passes when all are 0."""

INFO: dict[str, str] = {
    "samples": "records on samples",
    "prompts_fed": "records on prompts",
    "prompts_committed": "prompts below the rollout group's committed offsets",
    "steps": "step records that stand",
    "steps_void": "step records a trainer restart voided (their samples trained again)",
    "versions": "weight versions published",
    "syncs_complete": "syncs requested and published",
    "syncs_in_progress": "the last sync, not published when the log ends or the run finished",
    "syncs_abandoned": "syncs cut by the trainer's death (a restarted trainer came next)",
    "trainer_restarts": "TrainerResumed events",
    "worker_incarnations": "rollout worker processes started",
    "partials": "records on partials",
    "partials_in_progress": "partial samples of a run still going, not finished yet",
    "dropped_samples": "sample ids named by SamplesDropped",
    "dead_lettered": "records on dead-letter",
    "run_finished": "1 if RunFinished ends the log (no trainer restart after it)",
}
"""The counts shown beside the checks (not violations)."""

EXAMPLES = 5
"""Offending items kept per check (the count is always complete)."""


@dataclass
class RunLog:
    """A run's topics, decoded, each in log order."""

    prompts: list[PromptRecord] = field(default_factory=list)
    committed: set[str] = field(default_factory=set)
    """Sample ids of the prompts below the rollout group's committed offsets (taken, done)."""
    samples: list[Sample] = field(default_factory=list)
    partials: list[PartialSample] = field(default_factory=list)
    control: list[ev.ControlEvent] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    dead_letter: int = 0
    """Records on the dead-letter topic (not decoded: they are what failed to decode)."""
    undecodable: dict[str, int] = field(default_factory=dict)
    """Per topic, records that did not decode here (counted, left out of the checks)."""


@dataclass
class AuditReport:
    run_id: str
    violations: dict[str, int]
    info: dict[str, int]
    undecodable: dict[str, int]
    examples: dict[str, list[str]]

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "violations": self.violations,
            "info": self.info,
            "undecodable": self.undecodable,
            "examples": {k: v for k, v in self.examples.items() if v},
        }


# --- helpers ---------------------------------------------------------------------------------


def _of(events: Iterable[ev.ControlEvent], kind: type[ev.ControlEvent]) -> list:
    return [e for e in events if isinstance(e, kind)]


def _extra_copies(ids: Iterable[str]) -> list[str]:
    """Each id once per copy beyond its first."""
    return [i for i, n in Counter(ids).items() for _ in range(n - 1)]


def dropped_ids(control: list[ev.ControlEvent]) -> set[str]:
    """Sample ids named by a SamplesDropped (by the trainer, or by a worker at the run's end)."""
    return {sid for e in _of(control, ev.SamplesDropped) for sid in e.sample_ids}


def run_finished(control: list[ev.ControlEvent]) -> bool:
    """A RunFinished that no trainer restart followed (a trainer started again after one goes
    on with the run)."""
    return finishing_event(control) is not None


def finishing_event(control: Iterable[ev.ControlEvent]) -> ev.RunFinished | None:
    """The RunFinished that ends the run (``run_finished``), or None."""
    finished = None
    for e in control:
        if isinstance(e, ev.RunFinished):
            finished = e
        elif isinstance(e, ev.TrainerResumed):
            finished = None
    return finished


def read_control(cfg: RunConfig, bootstrap: str) -> list[ev.ControlEvent]:
    """The run's control events in log order, those that do not decode left out (a reader
    that needs only what the trainer and workers said: a restart, the run's end)."""
    from asyncrl.kafka.records import read_records
    from asyncrl.schemas import DecodeError

    events = []
    for rec in read_records(cfg, bootstrap, "control"):
        try:
            events.append(ev.decode_event(rec.value, rec.headers))
        except DecodeError:
            continue
    return events


# --- the checks ------------------------------------------------------------------------------


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
    under the version the trainer was at or the one before; and, unlogged, the refund of the
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
    for e in _of(control, ev.SamplesDropped):
        # The trainer's drops refund their worker (a duplicate's refunds nobody); a worker's
        # own, at the run's end, refund nothing.
        if e.worker == ev.TRAINER and e.target_worker >= 0:
            allowed[e.version] += e.count
            allowed[e.version - 1] += e.count
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


# --- the whole audit -------------------------------------------------------------------------


def audit(
    log: RunLog,
    max_samples_per_version: int,
    run_id: str = "",
    filters: FilterGroupsConfig | None = None,
    partial_rollout: bool = False,
) -> AuditReport:
    """Every check over ``log``, with the counts an operator looks at next to them;
    ``filters``: the run's dynamic sampling (``RunConfig.filters_groups``);
    ``partial_rollout``: its ``async_training.partial_rollout`` (mode d)."""
    c = log.control
    syncs = sync_outcomes(c)
    found: dict[str, list[str]] = {
        "duplicate_samples": duplicate_samples(log.samples),
        "duplicate_prompts": duplicate_prompts(log.prompts),
        "trained_twice": trained_twice(log.steps, c),
        "trained_missing": trained_missing(log.steps, log.samples),
        "lost_prompts": lost_prompts(log.committed, log.samples, c),
        "reused_versions": reused_versions(c),
        "mismatched_weights": mismatched_weights(c),
        "version_regressions": version_regressions(c),
        "incomplete_syncs": [f"version {v}" for v in syncs.incomplete],
        "over_budget_versions": over_budget_versions(
            log.samples, log.partials, c, max_samples_per_version, filters, partial_rollout
        ),
        "unfinished_partials": unfinished_partials(log.partials, log.samples, c, log.committed),
    }
    finished = run_finished(c)
    void = void_steps(log.steps, c)
    info = {
        "samples": len(log.samples),
        "prompts_fed": len(log.prompts),
        "prompts_committed": len(log.committed),
        "steps": void.count(False),
        "steps_void": void.count(True),
        "versions": len({e.version for e in _of(c, ev.WeightsPublished)}),
        "syncs_complete": len(syncs.complete),
        "syncs_in_progress": len(syncs.in_progress),
        "syncs_abandoned": len(syncs.abandoned),
        "trainer_restarts": sum(1 for e in c if isinstance(e, ev.TrainerResumed)),
        "worker_incarnations": len({e.incarnation for e in _of(c, ev.WorkerStarted)}),
        "partials": len(log.partials),
        "partials_in_progress": 0 if finished else len(open_partials(log.partials, log.samples, c)),
        "dropped_samples": len(dropped_ids(c)),
        "dead_lettered": log.dead_letter,
        "run_finished": int(finished),
    }
    return AuditReport(
        run_id=run_id,
        violations={k: len(v) for k, v in found.items()},
        info=info,
        undecodable=dict(log.undecodable),
        examples={k: v[:EXAMPLES] for k, v in found.items()},
    )


# --- reading the log -------------------------------------------------------------------------


class AuditError(RuntimeError):
    """The log could not be read (no such run on this broker, a broker that does not answer)."""


def read_run_log(cfg: RunConfig, bootstrap: str) -> RunLog:
    """Read every topic of ``cfg``'s run from its start to its current end, and the rollout
    group's committed offsets. A record that does not decode is counted, not fatal."""
    from confluent_kafka import KafkaException

    from asyncrl.kafka import Reader, UnknownTopic, raw_decode
    from asyncrl.kafka.records import read_records
    from asyncrl.schemas import DecodeError
    from asyncrl.schemas.partial import decode_partial
    from asyncrl.schemas.prompt import decode_prompt
    from asyncrl.schemas.sample import decode_sample
    from asyncrl.schemas.step import decode_step

    log = RunLog()

    def read(
        name: str, decode: Callable[[bytes | None, dict[str, bytes]], Any]
    ) -> list[tuple[tuple[int, int, int], Any]]:
        """((timestamp_ms, partition, offset), decoded) per record, decoded as it is read: a
        long run's prompts are millions of records, and holding them all raw before decoding
        took the audit of the 8k-step soak run to 5 GB."""
        out = []
        try:
            for rec in read_records(cfg, bootstrap, name):
                try:
                    out.append(
                        (
                            (rec.timestamp_ms, rec.partition, rec.offset),
                            decode(rec.value, rec.headers),
                        )
                    )
                except DecodeError:
                    log.undecodable[name] = log.undecodable.get(name, 0) + 1
        except UnknownTopic as err:
            raise AuditError(str(err)) from None
        except KafkaException as err:
            raise AuditError(f"cannot read {cfg.topic(name)} on {bootstrap}: {err}") from None
        if len({where[1] for where, _ in out}) > 1:  # log order across partitions: by time
            out.sort(key=lambda pair: pair[0])
        return out

    # kafka.topics.READ_ORDER: what refers to a record is read before it, so a live run's
    # log, read topic by topic while it grows, holds everything its records refer to.
    log.steps = [s for _, s in read("steps", decode_step)]
    log.partials = [p for _, p in read("partials", decode_partial)]
    log.samples = [s for _, s in read("samples", decode_sample)]
    prompts = read("prompts", decode_prompt)
    log.prompts = [p for _, p in prompts]
    log.control = [e for _, e in read("control", ev.decode_event)]
    log.dead_letter = len(read("dead-letter", raw_decode))

    topic = cfg.topic("prompts")
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.rollout") as group:
        committed = group.committed([(topic, p) for p in group.partitions(topic)])
    log.committed = {
        p.sample_id
        for (_ts, partition, offset), p in prompts
        if offset < (committed.get((topic, partition)) or 0)
    }
    return log


def audit_run(cfg: RunConfig, bootstrap: str) -> AuditReport:
    """Read ``cfg``'s run from ``bootstrap`` and audit it against ``cfg``'s budget."""
    log = read_run_log(cfg, bootstrap)
    return audit(
        log,
        cfg.max_samples_per_version,
        cfg.run_id,
        cfg.filters_groups,
        cfg.async_training.partial_rollout,
    )


def print_report(report: AuditReport, console: Console) -> None:
    """The counts as a table, violations in red, and a one-line verdict."""
    from rich.table import Table

    table = Table(title=f"audit of run {report.run_id}")
    table.add_column("check")
    table.add_column("count", justify="right")
    table.add_column("what it counts / examples", overflow="fold")
    for name, what in VIOLATIONS.items():
        n = report.violations[name]
        style = "bold red" if n else "green"
        examples = report.examples.get(name) or []
        detail = what + (
            f": {', '.join(examples)}" + (", ..." if n > len(examples) else "") if n else ""
        )
        table.add_row(f"[{style}]{name}[/]", f"[{style}]{n}[/]", detail)
    table.add_section()
    for name, n in report.info.items():
        table.add_row(f"[dim]{name}[/]", str(n), f"[dim]{INFO.get(name, '')}[/]")
    for name, n in sorted(report.undecodable.items()):
        table.add_row(
            f"[yellow]undecodable {name}[/]", f"[yellow]{n}[/]", "records that did not decode"
        )
    console.print(table)
    bad = {k: n for k, n in report.violations.items() if n}
    if not bad:
        console.print(
            f"[bold green]run {report.run_id}: clean[/] ({len(VIOLATIONS)} checks passed)"
        )
    else:
        n = sum(bad.values())
        console.print(
            f"[bold red]run {report.run_id}: {n} violation{'s' * (n != 1)}[/] in "
            f"{len(bad)} check{'s' * (len(bad) != 1)}: {', '.join(bad)}"
        )
