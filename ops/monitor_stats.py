"""The live monitor's aggregates per weight version, fed record by record by either backend
(``monitor``'s plain reader or ``monitor_faust``'s agent)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table

from asyncrl.config import RunConfig
from asyncrl.consumers.dynamic_sampling import REASON as FILTERED
from asyncrl.schemas import DecodeError
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample, decode_sample
from asyncrl.schemas.step import StepRecord, decode_step
from asyncrl.telemetry.metrics import stale_in_step


@dataclass
class VersionStats:
    produced: int = 0
    reward_sum: float = 0.0
    trajectories: int = 0
    partial: int = 0
    consumed: int = 0
    stale: int = 0
    staleness: Counter = field(default_factory=Counter)
    accuracy: float | None = None
    trainer_idle: float | None = None
    rollouter_idle: dict[int, float] = field(default_factory=dict)
    """Each worker's idle ratio while this version was the newest (its next RolloutResumed)."""
    budget_idle: dict[int, float] = field(default_factory=dict)
    """Of each worker's idle ratio, the part with the version's budget spent
    (rollouter/budget_idle_ratio): docs/tuning.md's first test of a staleness_threshold."""
    engine_occupancy: dict[int, float] = field(default_factory=dict)
    """Each worker's rollouter/engine_occupancy over the same window."""
    budget_unfilled: dict[int, float] = field(default_factory=dict)
    """Each worker's rollouter/budget_unfilled_ratio over the same window: its engine's empty
    share with the budget spent (the long-tail drain docs/tuning.md reads against budget_idle)."""


class RunMonitor:
    """The aggregates; fed one decoded record at a time, so they can be tested without Kafka."""

    def __init__(self) -> None:
        self.versions: dict[int, VersionStats] = defaultdict(VersionStats)
        self.published = 0
        self.trained = 0
        self.dropped = 0
        self.filtered = 0
        """Of the drops, groups dynamic sampling filtered (algorithm.filter_groups)."""
        self.dead_letters = 0
        self.undecodable = 0
        self.steps = 0
        self.workers: dict[int, str] = {}
        self.left: list[str] = []
        self.finished: str | None = None
        self._in_force: dict[int, StepRecord] = {}
        """The step records that stand, by step number: one a trainer restart voided (its
        samples are trained again) leaves the counts when the restart shows (``_void_above``)."""

    @property
    def lag(self) -> int:
        """Samples published but not yet trained on or dropped by the trainer."""
        return self.published - self.trained - self.dropped

    def add_sample(self, s: Sample) -> None:
        v = self.versions[s.param_version]
        v.produced += 1
        v.reward_sum += sum(s.rewards)
        v.trajectories += len(s.trajectories)
        v.partial += any(t.span > 0 for t in s.trajectories)
        self.published += 1

    def add_step(self, rec: StepRecord) -> None:
        # A record numbered at or below one already counted: a restarted trainer's, which
        # voided those (as ``audit.void_steps`` reads the log).
        self._void_above(rec.step - 1)
        self._in_force[rec.step] = rec
        self._count(rec, +1)
        m = rec.metrics
        v = self.versions[rec.version]
        if "val/accuracy" in m:
            v.accuracy = m["val/accuracy"]
        if "trainer/idle_ratio" in m:
            v.trainer_idle = m["trainer/idle_ratio"]
        self.steps = max(self.steps, rec.step)

    def _count(self, rec: StepRecord, sign: int) -> None:
        """Add (+1) or take back (-1) what a step record says was trained."""
        v = self.versions[rec.version]
        v.consumed += sign * len(rec.sample_ids)
        v.stale += sign * stale_in_step(rec.metrics)  # this step's (verl's is a total)
        for key, n in rec.metrics.items():
            if key.startswith("fully_async/staleness/count_"):
                v.staleness[int(key.rsplit("_", 1)[1])] += sign * int(n)
        self.trained += sign * len(rec.sample_ids)

    def _void_above(self, step: int) -> None:
        for number in [n for n in self._in_force if n > step]:
            self._count(self._in_force.pop(number), -1)

    def add_event(self, e: ev.ControlEvent) -> None:
        if isinstance(e, ev.RolloutResumed):
            if e.version > 0:  # it closes the window of the version before (0: start-up)
                v = self.versions[e.version - 1]
                v.rollouter_idle[e.worker] = e.idle_ratio
                v.budget_idle[e.worker] = e.budget_idle_ratio
                if e.engine_occupancy >= 0:
                    v.engine_occupancy[e.worker] = e.engine_occupancy
                if e.budget_unfilled_ratio >= 0:
                    v.budget_unfilled[e.worker] = e.budget_unfilled_ratio
        elif isinstance(e, ev.WorkerStarted):
            self.workers[e.worker] = e.incarnation
        elif isinstance(e, ev.WorkerStopped):
            self.left.append(f"worker {e.worker} ({e.reason})")
        elif isinstance(e, ev.SamplesDropped) and e.worker == ev.TRAINER:
            self.dropped += e.count
            if e.reason.startswith(FILTERED):
                self.filtered += e.count
        elif isinstance(e, ev.TrainerResumed):  # from its checkpoint's step: later ones void
            self._void_above(e.step)
        elif isinstance(e, ev.RunFinished):
            self.finished = e.reason

    def render(self, run_id: str, last_versions: int = 12) -> Group:
        parts = [
            f"[bold]{run_id}[/]",
            f"step {self.steps}",
            f"published {self.published}",
            f"trained {self.trained}",
            f"queue lag {self.lag}",
            f"dropped {self.dropped}" + (f" (filtered {self.filtered})" if self.filtered else ""),
            f"dead-letter {self.dead_letters}",
            f"workers {len(self.workers)}"
            + (f", left: {'; '.join(self.left)}" if self.left else ""),
        ]
        if self.finished:
            parts.append(f"[green]finished: {self.finished}[/]")
        head = "   ".join(parts)  # a line that wraps on a narrow terminal, never cut short
        table = Table(
            title="per weight version (newest last)",
            caption="made: samples published under the version; used: trained on at it; "
            "0/1/2+: how many versions behind; idle T/R: trainer/rollouters; budget: of idle R, "
            "the time with the version's budget spent; engine: how full the rollouters' engines "
            "ran; unfilled: their empty share with the budget spent (docs/tuning.md)",
        )
        for col in (
            "version", "made", "reward", "partial", "used", "stale", "0/1/2+", "acc",
            "idle T", "idle R", "budget", "engine", "unfilled",
        ):  # fmt: skip
            table.add_column(col, justify="right")
        for version in sorted(self.versions)[-last_versions:]:
            v = self.versions[version]
            st = v.staleness
            table.add_row(
                str(version),
                str(v.produced),
                _f(v.reward_sum / v.trajectories if v.trajectories else None),
                _f(v.partial / v.produced if v.produced else None),
                str(v.consumed),
                str(v.stale),
                f"{st[0]}/{st[1]}/{sum(n for k, n in st.items() if k >= 2)}" if st else "-",
                _f(v.accuracy, ".3f"),
                _f(v.trainer_idle),
                _f(_mean(v.rollouter_idle)),
                _f(_mean(v.budget_idle)),
                _f(_mean(v.engine_occupancy)),
                _f(_mean(v.budget_unfilled)),
            )
        return Group(head, table)


def _mean(per_worker: dict[int, float]) -> float | None:
    return sum(per_worker.values()) / len(per_worker) if per_worker else None


def _f(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def before(limits: dict[str, dict[int, int]] | None, rec: Any) -> bool:
    """Whether ``rec`` is below its partition's end in ``limits`` (None: every record is):
    ``monitor --once`` feeds the log as it was when it started (ops/monitor.py)."""
    return limits is None or rec.offset < limits.get(rec.topic, {}).get(rec.partition, 0)


def feed(mon: RunMonitor, cfg: RunConfig, records: list[Any]) -> None:
    """Decode raw records by topic and hand them to the monitor; bad ones are only counted."""
    for rec in records:
        name = rec.topic.removeprefix(f"{cfg.run_id}.")
        try:
            if name == "samples":
                mon.add_sample(decode_sample(rec.value, rec.headers))
            elif name == "steps":
                mon.add_step(decode_step(rec.value, rec.headers))
            elif name == "control":
                mon.add_event(ev.decode_event(rec.value, rec.headers))
            elif name == "dead-letter":
                mon.dead_letters += 1
        except DecodeError:
            mon.undecodable += 1  # the trainer dead-letters them; the monitor only counts
