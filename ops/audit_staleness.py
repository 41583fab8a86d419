"""The audit's staleness checks: what ``async_training.staleness_threshold`` promises of the
samples a run trained, counted on the version lineage (``consumers/lineage.py``).

- **Per sync window.** The steps a trainer took under one version form its window; a sample
  is stale there if its generation started under other weights (lag >= 1 on the lineage). A
  window trains at most ``max_samples_per_version - samples_per_version`` stale samples (verl's
  arithmetic: 16 of 32 with the demo's 0.5), plus what the log says the workers were given
  beyond their budgets under the version before it or its own: ``BudgetGranted``, the trainer's
  refunds (``SamplesDropped`` with a target worker) and, with dynamic sampling, the slots of
  groups with no signal taken back.
- **Per sample.** A trained sample's lag is at most ``ceil(staleness_threshold)`` (1 with the
  demo's settings; 0 in the synchronous modes).

Steps a restarted trainer voided are left out (their samples were trained again); samples of
versions the control log does not hold (replayed in from another run) are not counted.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.consumers.lineage import Lineage
from asyncrl.ops.audit_budget import slots_taken_back
from asyncrl.ops.audit_checks import void_steps
from asyncrl.ops.audit_log import RunLog, _of
from asyncrl.schemas import control as ev


def lag_bound(staleness_threshold: float) -> int:
    """The most versions a trained sample may be behind the trainer: ``ceil(threshold)``."""
    return math.ceil(staleness_threshold)


@dataclass
class Window:
    version: int
    depth: int
    steps: list[int] = field(default_factory=list)
    trained: int = 0
    stale: int = 0
    bound: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Staleness:
    """What the checks found: per window, and the trained samples with a lag."""

    windows: list[Window] = field(default_factory=list)
    lagged: list[dict[str, Any]] = field(default_factory=list)
    """Per trained sample with lag >= 1: id, worker, its version, the step, the trainer's
    version, the lag."""
    max_lag: int = 0
    max_stale: int = 0

    def over_windows(self) -> list[str]:
        return [
            f"version {w.version} (steps {w.steps[0]}-{w.steps[-1]}): {w.stale} stale "
            f"samples, at most {w.bound}"
            for w in self.windows
            if w.stale > w.bound
        ]

    def over_lag(self, bound: int) -> list[str]:
        return [
            f"{s['sample_id']}: version {s['param_version']} trained at version "
            f"{s['trainer_version']} (step {s['step']}), lag {s['lag']}"
            for s in self.lagged
            if s["lag"] > bound
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_stale_per_window": self.max_stale,
            "max_lag": self.max_lag,
            "windows": [w.to_dict() for w in self.windows],
            "lagged_samples": self.lagged,
        }


def extra_allowance(log: RunLog, filters: FilterGroupsConfig | None) -> Counter[int]:
    """Per version, the samples workers could start under it beyond their budgets' split of
    ``max_samples_per_version``: grants, the trainer's refunds, slots taken back."""
    extra: Counter[int] = Counter()
    for e in _of(log.control, ev.BudgetGranted):
        extra[e.version] += e.count
    for e in _of(log.control, ev.SamplesDropped):
        if e.worker == ev.TRAINER and e.target_worker >= 0:
            extra[e.version] += e.count
    extra.update(slots_taken_back(log.samples, filters))
    return extra


def staleness(
    log: RunLog,
    max_samples_per_version: int,
    samples_per_version: int,
    filters: FilterGroupsConfig | None = None,
) -> Staleness:
    """Every standing step's samples, their lag on the lineage, per window."""
    lineage = Lineage(log.control)
    versions = {s.sample_id: (s.param_version, s.worker_id) for s in reversed(log.samples)}
    extra = extra_allowance(log, filters)
    aliases: dict[int, list[int]] = defaultdict(list)
    for v, named in lineage.nodes.items():
        aliases[id(named)].append(v)
    base = max(0, max_samples_per_version - samples_per_version)
    out = Staleness()
    by_version: dict[int, Window] = {}
    void = void_steps(log.steps, log.control)
    for step, is_void in zip(log.steps, void, strict=True):
        if is_void:
            continue
        t = step.version
        node = lineage.nodes.get(t)
        if node is None:
            continue
        window = by_version.get(t)
        if window is None:
            before = aliases[id(node.parent)] if node.parent is not None else []
            own = aliases[id(node)]
            bound = base + sum(extra[v] for v in {*before, *own})
            window = by_version[t] = Window(t, node.depth, bound=bound)
            out.windows.append(window)
        window.steps.append(step.step)
        for sid in step.sample_ids:
            if sid not in versions:
                continue
            param_version, worker = versions[sid]
            lag = lineage.lag(param_version, t)
            if lag is None:
                continue
            window.trained += 1
            if lag >= 1:
                window.stale += 1
                out.lagged.append(
                    {
                        "sample_id": sid,
                        "worker": worker,
                        "param_version": param_version,
                        "step": step.step,
                        "trainer_version": t,
                        "lag": lag,
                    }
                )
                out.max_lag = max(out.max_lag, lag)
    out.max_stale = max((w.stale for w in out.windows), default=0)
    return out
