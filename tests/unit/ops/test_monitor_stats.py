"""The monitor's aggregates (ops/monitor_stats.py), fed decoded records without Kafka."""

from __future__ import annotations

from asyncrl.ops.monitor_stats import RunMonitor
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample, Trajectory
from asyncrl.schemas.step import StepRecord


def _step(n: int, version: int, ids: list[str]) -> StepRecord:
    return StepRecord("r", n, version, float(n), ids, [0] * len(ids), list(range(len(ids))))


def test_steps_a_trainer_restart_voided_leave_the_trained_count():
    """A trainer killed after step 3 (checkpoint at 2); the new one trains step 3 again on the
    same samples. The monitor counted both records: 'published 1232 trained 1248 queue lag -16'
    on a run that audits clean."""
    mon = RunMonitor()
    for i in range(8):
        mon.add_sample(Sample(f"s{i}", f"p{i}", 0, [1], "1", [Trajectory([3], [-0.1], 1.0)]))
    for n in (1, 2, 3):
        mon.add_step(_step(n, n - 1, [f"s{2 * n - 2}", f"s{2 * n - 1}"]))
    assert (mon.trained, mon.lag) == (6, 2)
    mon.add_event(ev.TrainerResumed("r", 3, step=2, checkpoint_version=1, last_logged_version=2))
    assert (mon.trained, mon.lag) == (4, 4)  # step 3 voided: its samples are to be trained again
    mon.add_step(_step(3, 3, ["s4", "s5"]))
    mon.add_step(_step(4, 3, ["s6", "s7"]))
    assert (mon.trained, mon.lag) == (8, 0)
    assert mon.versions[2].consumed == 0 and mon.versions[3].consumed == 4
    # Read without the restart's event first (topics read apart): the record numbered 3 again
    # voids the first one as it arrives.
    late = RunMonitor()
    for n, version in ((1, 0), (2, 1), (3, 2), (3, 3)):
        late.add_step(_step(n, version, [f"x{n}"]))
    assert late.trained == 3 and late.versions[2].consumed == 0


def test_the_version_table_shows_the_budget_ratios_docs_tuning_reads():
    """docs/tuning.md tells a user to compare rollouter/budget_idle_ratio with idle_ratio, and
    budget_unfilled_ratio with budget_idle_ratio, in the monitor among others; its table showed
    idle R and engine only. Found by a tuning walkthrough: both are columns, per version the
    mean over the workers' windows."""
    from rich.console import Console

    mon = RunMonitor()
    for worker, (idle, budget, occ, unfilled) in enumerate(
        [(0.40, 0.30, 0.50, 0.45), (0.20, 0.10, 0.70, 0.25)]
    ):
        mon.add_event(
            ev.RolloutResumed(
                "r", 2, worker=worker, idle_ratio=idle, budget_idle_ratio=budget,
                engine_occupancy=occ, budget_unfilled_ratio=unfilled,
            )
        )  # fmt: skip
    v = mon.versions[1]
    assert sum(v.budget_idle.values()) / 2 == 0.2 and sum(v.budget_unfilled.values()) / 2 == 0.35
    console = Console(width=200, record=True)
    console.print(mon.render("r"))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "version" in line and "idle R" in line)
    assert [c.strip() for c in header.strip("┃│ ").split("┃")][-4:] == [
        "idle R", "budget", "engine", "unfilled",
    ]  # fmt: skip
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith("1 "))
    assert [c.strip() for c in row.strip("│ ").split("│")][-4:] == ["0.30", "0.20", "0.60", "0.35"]
