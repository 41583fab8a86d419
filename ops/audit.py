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

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from asyncrl.config import RunConfig
from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.ops.audit_budget import over_budget_versions
from asyncrl.ops.audit_checks import (
    duplicate_prompts,
    duplicate_samples,
    lost_prompts,
    mismatched_weights,
    open_partials,
    reused_versions,
    sync_outcomes,
    trained_missing,
    trained_twice,
    unfinished_partials,
    version_regressions,
    void_steps,
)
from asyncrl.ops.audit_log import (
    AuditError,
    RunLog,
    _of,
    dropped_ids,
    finishing_event,
    read_control,
    read_run_log,
    run_finished,
)
from asyncrl.ops.audit_staleness import Staleness, lag_bound, staleness
from asyncrl.schemas import control as ev

__all__ = [
    "AuditError",
    "AuditReport",
    "RunLog",
    "audit",
    "audit_run",
    "finishing_event",
    "print_report",
    "read_control",
    "read_run_log",
    "sync_outcomes",
    "void_steps",
]

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
    "over_stale_windows": "sync windows that trained more stale samples than the threshold allows",
    "over_lag_samples": "trained samples further from the trainer's weights than the mode allows",
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
    "max_stale_per_window": "the most stale samples one sync window trained",
    "max_lag": "the largest lag of a trained sample, in syncs on the version lineage",
}
"""The counts shown beside the checks (not violations)."""

EXAMPLES = 5
"""Offending items kept per check (the count is always complete)."""


@dataclass
class AuditReport:
    run_id: str
    violations: dict[str, int]
    info: dict[str, int]
    undecodable: dict[str, int]
    examples: dict[str, list[str]]
    staleness: dict[str, Any] = field(default_factory=dict)
    """Per window and per lagged sample (``Staleness.to_dict``): ``--json`` prints it."""

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
            "staleness": self.staleness,
        }


def audit(
    log: RunLog,
    max_samples_per_version: int,
    run_id: str = "",
    filters: FilterGroupsConfig | None = None,
    partial_rollout: bool = False,
    samples_per_version: int | None = None,
    max_lag: int | None = None,
) -> AuditReport:
    """Every check over ``log``, with the counts an operator looks at next to them;
    ``filters``: the run's dynamic sampling (``RunConfig.filters_groups``);
    ``partial_rollout``: its ``async_training.partial_rollout`` (mode d);
    ``samples_per_version``: a window's samples (``RunConfig.samples_per_version``), None to
    leave the per-window check out; ``max_lag``: a trained sample's most lag (``lag_bound``),
    None to leave it out."""
    c = log.control
    syncs = sync_outcomes(c)
    stale = (
        staleness(log, max_samples_per_version, samples_per_version or 0, filters)
        if samples_per_version is not None or max_lag is not None
        else Staleness()
    )
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
        "over_stale_windows": stale.over_windows() if samples_per_version is not None else [],
        "over_lag_samples": stale.over_lag(max_lag) if max_lag is not None else [],
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
        "max_stale_per_window": stale.max_stale,
        "max_lag": stale.max_lag,
    }
    return AuditReport(
        run_id=run_id,
        violations={k: len(v) for k, v in found.items()},
        info=info,
        undecodable=dict(log.undecodable),
        examples={k: v[:EXAMPLES] for k, v in found.items()},
        staleness=stale.to_dict(),
    )


def audit_run(cfg: RunConfig, bootstrap: str) -> AuditReport:
    """Read ``cfg``'s run from ``bootstrap`` and audit it against ``cfg``'s budget."""
    log = read_run_log(cfg, bootstrap)
    return audit(
        log,
        cfg.max_samples_per_version,
        cfg.run_id,
        cfg.filters_groups,
        cfg.async_training.partial_rollout,
        samples_per_version=cfg.samples_per_version,
        max_lag=lag_bound(cfg.async_training.staleness_threshold),
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
