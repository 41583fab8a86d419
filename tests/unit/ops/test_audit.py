"""The audit's checks on hand-built logs: a clean run counts nothing, and each fault planted
alone is counted exactly once; what a correct run leaves open is not a violation."""

from __future__ import annotations

import dataclasses

import pytest

from asyncrl.ops.audit import INFO, VIOLATIONS, RunLog, audit, sync_outcomes, void_steps
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import PartialSample
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import Sample, Trajectory
from asyncrl.schemas.step import StepRecord

RUN = "r"
BUDGET = 4
"""max_samples_per_version of the hand-built run: one worker, 2 samples a step, 2 steps a sync."""


def sid(i: int) -> str:
    return f"p{i}@0"


def sample(i: int, version: int, start: int | None = None, worker: int = 0) -> Sample:
    start = version if start is None else start
    traj = Trajectory([5, 2], [-1.0, -0.5], 1.0, param_version=version, param_version_start=start)
    return Sample(sid(i), f"p{i}", worker, [1, 4], "7", [traj, dataclasses.replace(traj)])


def partial(i: int, version: int, worker: int = 0) -> PartialSample:
    s = sample(i, version, worker=worker)
    for t in s.trajectories:
        t.finish_reason = "abort"
    return PartialSample(s, interrupted_at_version=version, prompt_partition=0, prompt_offset=i)


def step(n: int, version: int, *ids: int | str, ts: float | None = None) -> StepRecord:
    names = [sid(i) if isinstance(i, int) else i for i in ids]
    return StepRecord(
        RUN, n, version, float(n) if ts is None else ts, names, [0] * len(names), [0] * len(names)
    )


def sync(version: int, ts: float = 0.0) -> list[ev.ControlEvent]:
    """One whole sync to ``version`` of the single worker, as its events land on the log."""
    return [
        ev.SyncRequested(RUN, version, ts=ts),
        ev.RolloutPaused(RUN, version, worker=0),
        ev.WeightsPublished(RUN, version, checksum=f"c{version}", incarnations=["a"], ts=ts),
        ev.WeightsLoaded(RUN, version, worker=0),
        ev.RolloutResumed(RUN, version, worker=0, budget=BUDGET),
    ]


def clean() -> RunLog:
    """Versions 0 and 1, three steps, a sample in flight dropped when the run finished."""
    control = [
        ev.WorkerStarted(RUN, 0, worker=0, incarnation="a"),
        ev.WeightsPublished(RUN, 0, checksum="c0", incarnations=["a"]),
        ev.WeightsLoaded(RUN, 0, worker=0),
        ev.RolloutResumed(RUN, 0, worker=0, budget=BUDGET),
        *sync(1, ts=2.5),
        ev.RunFinished(RUN, 1, step=3),
        ev.SamplesDropped(RUN, 1, worker=0, target_worker=0, count=1, sample_ids=[sid(8)]),
        ev.WorkerStopped(RUN, 1, worker=0, reason="run finished", produced=8),
    ]
    return RunLog(
        prompts=[PromptRecord(f"p{i}", "1+6=", "7") for i in range(10)],
        committed={sid(i) for i in range(8)},
        samples=[*(sample(i, 0) for i in range(4)), *(sample(i, 1) for i in range(4, 8))],
        control=control,
        steps=[step(1, 0, 0, 1), step(2, 0, 2, 3), step(3, 1, 4, 5)],
    )


def counts(log: RunLog) -> dict[str, int]:
    report = audit(log, BUDGET, RUN)
    return {k: n for k, n in report.violations.items() if n}


def before_finish(log: RunLog, *events: ev.ControlEvent) -> None:
    """Insert ``events`` just before the RunFinished."""
    at = next(i for i, e in enumerate(log.control) if isinstance(e, ev.RunFinished))
    log.control[at:at] = events


def test_a_clean_log_counts_nothing():
    report = audit(clean(), BUDGET, RUN)
    assert report.ok and set(report.violations) == set(VIOLATIONS)
    assert report.info["samples"] == 8 and report.info["steps"] == 3
    assert report.info["prompts_fed"] == 10 and report.info["prompts_committed"] == 8
    assert report.info["versions"] == 2 and report.info["syncs_complete"] == 1
    assert report.info["dropped_samples"] == 1 and report.info["run_finished"] == 1


def plant_duplicate_sample(log: RunLog) -> None:
    log.samples.append(dataclasses.replace(log.samples[2]))


def plant_duplicate_prompt(log: RunLog) -> None:
    log.prompts.append(PromptRecord("p3", "1+6=", "7"))


def plant_trained_twice(log: RunLog) -> None:
    log.steps.append(step(4, 1, 6, 6))  # one record naming a sample twice


def plant_trained_again(log: RunLog) -> None:
    log.steps.append(step(4, 1, 0, 6))  # p0 was trained at step 1


def plant_trained_missing(log: RunLog) -> None:
    log.steps.append(step(4, 1, "ghost@0", 6))


def plant_lost_prompt(log: RunLog) -> None:
    log.committed.add(sid(9))


def plant_reused_version(log: RunLog) -> None:
    before_finish(log, ev.WeightsPublished(RUN, 1, checksum="other", incarnations=["b"]))


def plant_mismatched_weights(log: RunLog) -> None:
    at = next(i for i, e in enumerate(log.control) if isinstance(e, ev.WeightsLoaded))
    log.control[at] = dataclasses.replace(log.control[at], checksum_ok=False)


def plant_version_regression(log: RunLog) -> None:
    at = next(i for i, e in enumerate(log.control) if isinstance(e, ev.SyncRequested))
    log.control.insert(at + 1, ev.SyncRequested(RUN, 1))  # both are published after


def plant_incomplete_sync(log: RunLog) -> None:
    before_finish(log, ev.SyncRequested(RUN, 2), *sync(3))


def plant_over_budget(log: RunLog) -> None:
    log.samples.append(sample(9, 1))  # a fifth sample under version 1


def plant_unfinished_partial(log: RunLog) -> None:
    log.committed.add(sid(9))  # its prompt done, yet neither sample nor drop
    log.partials.append(partial(9, 1))


@pytest.mark.parametrize(
    "plant, check",
    [
        (plant_duplicate_sample, "duplicate_samples"),
        (plant_duplicate_prompt, "duplicate_prompts"),
        (plant_trained_twice, "trained_twice"),
        (plant_trained_again, "trained_twice"),
        (plant_trained_missing, "trained_missing"),
        (plant_lost_prompt, "lost_prompts"),
        (plant_reused_version, "reused_versions"),
        (plant_mismatched_weights, "mismatched_weights"),
        (plant_version_regression, "version_regressions"),
        (plant_incomplete_sync, "incomplete_syncs"),
        (plant_over_budget, "over_budget_versions"),
        (plant_unfinished_partial, "unfinished_partials"),
    ],
)
def test_each_fault_alone_is_counted_once(plant, check):
    log = clean()
    plant(log)
    also = {"lost_prompts": 1} if check == "unfinished_partials" else {}  # its prompt, too
    assert counts(log) == {check: 1, **also}
    report = audit(log, BUDGET, RUN)
    assert not report.ok and len(report.examples[check]) == 1


def test_counts_are_exact():
    log = clean()
    for _ in range(3):
        plant_duplicate_sample(log)
    log.steps.append(step(4, 1, 0, 1, 6, 6))  # 0 and 1 again, 6 twice
    log.committed |= {sid(9), "q@0"}
    assert counts(log) == {"duplicate_samples": 3, "trained_twice": 3, "lost_prompts": 2}


def test_an_old_version_republished_with_other_weights_is_reused_and_a_regression():
    log = clean()
    before_finish(log, ev.WeightsPublished(RUN, 0, checksum="other", incarnations=["b"]))
    assert counts(log) == {"reused_versions": 1, "version_regressions": 1}


def test_a_partial_handed_back_to_the_group_is_not_lost():
    log = clean()
    log.partials.append(partial(9, 1))  # its worker left; the prompt waits, not committed
    assert counts(log) == {}


def test_a_partial_later_finished_is_accounted():
    log = clean()
    log.partials.append(partial(5, 1))  # interrupted, then published as sample 5
    assert counts(log) == {}


def test_a_prompt_dropped_at_the_run_end_is_accounted():
    log = clean()
    log.committed.add(sid(8))
    log.partials.append(partial(8, 1))
    assert counts(log) == {}
    log.control = [e for e in log.control if not isinstance(e, ev.SamplesDropped)]
    assert counts(log) == {"lost_prompts": 1, "unfinished_partials": 1}


def test_a_sync_pending_at_run_finished_is_in_progress():
    log = clean()
    before_finish(log, ev.SyncRequested(RUN, 2))
    report = audit(log, BUDGET, RUN)
    assert report.ok and report.info["syncs_in_progress"] == 1


def test_a_run_still_going_leaves_syncs_and_partials_open():
    log = clean()
    log.control = [e for e in log.control if not isinstance(e, ev.RunFinished)]
    log.control.append(ev.SyncRequested(RUN, 2))
    log.partials.append(partial(9, 1))
    report = audit(log, BUDGET, RUN)
    assert report.ok
    assert report.info["syncs_in_progress"] == 1 and report.info["partials_in_progress"] == 1
    assert report.info["run_finished"] == 0


def test_a_trainer_restart_voids_the_steps_it_lost_and_abandons_its_sync():
    """Trainer died after step 3 (checkpoint of step 2) during the sync to version 2; the new
    one publishes its weights as version 3 and trains step 3 again on the same samples."""
    log = clean()
    log.control = [e for e in log.control if not isinstance(e, ev.RunFinished | ev.SamplesDropped)]
    log.control += [
        ev.SyncRequested(RUN, 2, ts=3.5),
        ev.TrainerResumed(RUN, 3, step=2, checkpoint_version=1, last_logged_version=2, ts=4.0),
        ev.WeightsPublished(RUN, 3, checksum="c3", incarnations=["a"]),
        ev.RunFinished(RUN, 3, step=3),
        ev.SamplesDropped(RUN, 3, worker=0, target_worker=0, count=1, sample_ids=[sid(8)]),
    ]
    log.steps.append(step(3, 3, 4, 5, ts=5.0))
    assert void_steps(log.steps, log.control) == [False, False, True, False]
    report = audit(log, BUDGET, RUN)
    assert report.ok, report.violations
    assert report.info["steps_void"] == 1 and report.info["steps"] == 3
    assert report.info["syncs_abandoned"] == 1 and report.info["trainer_restarts"] == 1


def test_a_restart_of_the_trainer_voids_later_steps_even_before_it_trains():
    log = clean()
    log.control.append(ev.TrainerResumed(RUN, 2, step=2, ts=10.0))
    assert void_steps(log.steps, log.control) == [False, False, True]


def test_a_trainer_restart_must_not_reuse_a_version():
    log = clean()
    before_finish(log, ev.TrainerResumed(RUN, 1, step=2))
    assert counts(log) == {"version_regressions": 1}


def test_budget_counts_every_opening_and_what_was_given_back():
    log = clean()
    log.samples += [sample(9, 1), sample(10, 1)]
    assert counts(log) == {"over_budget_versions": 1}
    # A restarted worker opens version 1 again with what it is owed.
    again = clean()
    again.samples += [sample(9, 1), sample(10, 1)]
    before_finish(again, ev.RolloutResumed(RUN, 1, worker=0, incarnation="b", budget=2))
    assert counts(again) == {}
    # A sample dropped by the trainer (max_version_lag) is refunded; a duplicate is not.
    refund = clean()
    refund.samples.append(sample(9, 1))
    drop = ev.SamplesDropped(RUN, 1, target_worker=0, count=1, sample_ids=[sid(0)])
    before_finish(refund, drop)
    assert counts(refund) == {}
    before_finish(refund, ev.BudgetGranted(RUN, 1, target_worker=0, count=1))
    refund.samples.append(sample(10, 1))
    assert counts(refund) == {}
    dup = clean()
    dup.samples.append(sample(9, 1))
    before_finish(dup, dataclasses.replace(drop, target_worker=ev.TRAINER))
    assert counts(dup) == {"over_budget_versions": 1}


def test_groups_filtered_by_dynamic_sampling_give_their_slots_back_as_they_are_published():
    """filter_groups: the worker takes the slot of a group with no signal back as it publishes
    it (the trainer will leave it out), so the refill is allowed under the version the group
    was published at; the trainer's SamplesDropped naming it refunds no one. Under version 1
    two groups have no signal (p5, p7, never trained), two refills (p8, p9) are trained."""
    from asyncrl.config.offpolicy import FilterGroupsConfig

    log = clean()
    log.steps[-1] = step(3, 1, 4, 6)
    log.steps.append(step(4, 1, 8, 9))
    log.samples += [sample(8, 1), sample(9, 1)]
    for s in log.samples:
        if s.sample_id not in (sid(5), sid(7)):
            s.trajectories[1].reward = 0.0  # a signal: kept
    log.committed |= {sid(8), sid(9)}
    log.control = [e for e in log.control if not isinstance(e, ev.SamplesDropped)]
    filtered = [
        ev.SamplesDropped(
            RUN,
            1,
            target_worker=ev.TRAINER,
            count=1,
            reason="filter_groups: ...",
            sample_ids=[sid(i)],
        )
        for i in (5, 7)
    ]
    before_finish(log, *filtered)
    report = audit(log, BUDGET, RUN, FilterGroupsConfig(enable=True))
    assert report.ok, report.to_dict()
    assert report.info["dropped_samples"] == 2
    # A run without dynamic sampling took no slot back: the refills are over budget.
    assert counts(log) == {"over_budget_versions": 1}
    # Nor does a group with a signal give its slot back.
    p5 = next(s for s in log.samples if s.sample_id == sid(5))
    p5.trajectories[1].reward = 0.0
    report = audit(log, BUDGET, RUN, FilterGroupsConfig(enable=True))
    assert report.violations["over_budget_versions"] == 1


def test_budget_counts_a_partial_rollout_under_its_first_version():
    log = clean()
    log.samples[4] = sample(4, 1, start=0)  # started under 0, finished under 1
    assert counts(log) == {"over_budget_versions": 1}  # five under version 0


def test_an_in_flight_update_lets_a_sample_admitted_before_the_swap_start_after_it():
    """Mode (d) with in_flight_update logs no partial: a sample the worker admitted under 0
    (in flight at the swap, so counted stale by version 1's opening) whose first token came
    under 1 was an over-budget violation of a correct run (seen with a slow interaction)."""
    log = clean()
    log.samples[3] = sample(3, 1)  # admitted under 0, its first token under 1
    log.control = [
        dataclasses.replace(e, num_stale=1)
        if isinstance(e, ev.RolloutResumed) and e.version == 1
        else e
        for e in log.control
    ]
    report = audit(log, BUDGET, RUN, partial_rollout=True)
    assert report.ok, report.to_dict()
    assert counts(log) == {"over_budget_versions": 1}  # not in mode (c)


def test_partials_moved_between_workers_allow_their_refund():
    """Mode (d): a worker's prompt partition moves away mid-version; its partials are logged
    (not at a sync), it is refunded and starts another, and the other worker continues the
    moved sample under a later version: one more sample under version 1 than its budget."""
    log = clean()
    log.samples += [sample(9, 1)]
    log.partials.append(partial(9, 1))  # logged at the move: no RolloutPaused counts it
    assert counts(log) == {}
    at_sync = clean()
    at_sync.samples += [sample(9, 1)]
    at_sync.partials.append(partial(9, 1))
    before_finish(at_sync, ev.RolloutPaused(RUN, 2, worker=0, n_partial=1))
    assert counts(at_sync) == {"over_budget_versions": 1}


def test_samples_without_any_worker_budget_are_not_checked():
    log = clean()
    log.control = [e for e in log.control if not isinstance(e, ev.RolloutResumed)]
    assert counts(log) == {}


def test_every_sync_has_one_outcome():
    control = [
        ev.SyncRequested(RUN, 1),
        ev.WeightsPublished(RUN, 1),
        ev.SyncRequested(RUN, 2),  # never published, and the trainer went on
        ev.SyncRequested(RUN, 3),
        ev.WeightsPublished(RUN, 3),
        ev.SyncRequested(RUN, 4),  # the trainer died during it
        ev.TrainerResumed(RUN, 5, step=3),
        ev.WeightsPublished(RUN, 5),
        ev.SyncRequested(RUN, 6),  # going on as the log ends
    ]
    out = sync_outcomes(control)
    assert (out.complete, out.incomplete, out.abandoned, out.in_progress) == ([1, 3], [2], [4], [6])


def test_report_serializes():
    report = audit(clean(), BUDGET, RUN)
    d = report.to_dict()
    assert d["ok"] is True and d["run_id"] == RUN and d["violations"]["lost_prompts"] == 0
    assert d["examples"] == {} and set(d["info"]) == set(INFO)


def test_a_live_runs_topics_are_read_before_what_they_refer_to(tmp_path, monkeypatch):
    """Read while the run writes, a sample read after its version's budget on control was
    counted over budget (``asyncrl audit`` of a live run exited 1, clean once it finished):
    steps, partials, samples and prompts are read before control, by the audit and by the
    archive's restore."""
    import asyncrl.kafka.records as records
    from asyncrl.config import load_config
    from asyncrl.kafka.topics import READ_ORDER
    from asyncrl.launch.log_archive import _in_read_order
    from asyncrl.ops.audit import read_run_log

    cfg = load_config(overrides=["run_id=order"])
    read: list[str] = []

    def recording(cfg, bootstrap, name):
        read.append(name)
        return iter(())

    monkeypatch.setattr(records, "read_records", recording)

    class NoGroup:
        def __init__(self, *a, **k): ...
        def __enter__(self):
            return self

        def __exit__(self, *a): ...
        def partitions(self, topic):
            return []

        def committed(self, parts):
            return {}

    import asyncrl.kafka as kafka

    monkeypatch.setattr(kafka, "Reader", NoGroup)
    read_run_log(cfg, "unused:9092")
    assert read == list(READ_ORDER)
    assert read.index("control") > max(read.index(t) for t in ("samples", "steps", "prompts"))
    files = {(cfg.topic(t), 0): tmp_path / t for t in sorted(READ_ORDER)}  # alphabetical
    assert [t for (t, _), _ in _in_read_order(cfg, files)] == [cfg.topic(t) for t in READ_ORDER]


class _Raw:
    """A record's raw value that counts how many are alive at once."""

    alive = 0

    def __init__(self, i: int) -> None:
        self.i = i
        _Raw.alive += 1

    def __del__(self) -> None:
        _Raw.alive -= 1


def test_the_log_is_decoded_as_it_is_read_not_held_raw_first(monkeypatch):
    """The audit of the soak run (1.6M prompts) held every raw record before decoding any,
    and took 5 GB: at most a few raw values may be alive while a topic is decoded."""
    from asyncrl.config import load_config
    from asyncrl.kafka import Record, records
    from asyncrl.ops.audit import read_run_log
    from asyncrl.schemas import prompt as prompt_schema

    cfg = load_config(None, [])
    n, peak = 500, []

    def read_records(_cfg, _bootstrap, name, *_a, **_kw):
        for i in range(n if name == "prompts" else 0):
            yield Record(cfg.topic(name), i % 2, i // 2, None, i, {}, _Raw(i))

    def decode_prompt(value, _headers):
        peak.append(_Raw.alive)
        return PromptRecord(f"p{value.i}", "1+1=", "2")

    class _Group:
        def __init__(self, *_a, **_kw) -> None:
            pass

        def __enter__(self) -> _Group:
            return self

        def __exit__(self, *_exc) -> None:
            return None

        def partitions(self, _topic: str) -> list[int]:
            return [0, 1]

        def committed(self, tps):
            return {tp: 100 for tp in tps}

    monkeypatch.setattr(records, "read_records", read_records)
    monkeypatch.setattr(prompt_schema, "decode_prompt", decode_prompt)
    monkeypatch.setattr("asyncrl.kafka.Reader", _Group)
    log = read_run_log(cfg, "b:9092")
    assert len(log.prompts) == n and max(peak) <= 2
    assert [p.prompt_id for p in log.prompts[:3]] == ["p0", "p1", "p2"]  # by time
    assert log.committed == {f"p{i}@0" for i in range(200)}  # offsets 0-99 of both


def test_the_verdict_counts_one_violation_in_the_singular() -> None:
    from rich.console import Console

    from asyncrl.ops.audit import VIOLATIONS, AuditReport, print_report

    one = {name: 0 for name in VIOLATIONS} | {next(iter(VIOLATIONS)): 1}
    console = Console(record=True, width=200)
    print_report(AuditReport("r", one, {}, {}, {}), console)
    verdict = console.export_text().strip().splitlines()[-1]
    assert verdict.startswith("run r: 1 violation in 1 check:"), verdict
