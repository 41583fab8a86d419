"""The version lineage (consumers/lineage.py) and the audit's staleness checks on hand-built
logs: lag is counted in syncs on the tree of weights, a resumed trainer's version stands where
its checkpoint's weights do, and a window over its stale share or a sample past the lag bound
is counted."""

from __future__ import annotations

from asyncrl.consumers.lineage import Lineage
from asyncrl.ops.audit import RunLog, audit
from asyncrl.ops.audit_staleness import lag_bound
from asyncrl.schemas import control as ev
from tests.unit.ops.test_audit import RUN, sample, step


def published(version: int, at_step: int) -> ev.WeightsPublished:
    return ev.WeightsPublished(RUN, version, step=at_step)


def killed_past_its_checkpoint() -> list[ev.ControlEvent]:
    """A sync every 4 steps; checkpoint at step 20 under version 4; versions 5 (step 20) and
    6 (step 24) published; the restarted trainer publishes the checkpoint as version 7."""
    events: list[ev.ControlEvent] = [published(v, 4 * v) for v in range(7)]
    events.append(ev.TrainerResumed(RUN, 7, step=20, checkpoint_version=4, last_logged_version=6))
    events += [published(7, 20), published(8, 24), published(9, 28)]
    return events


def test_a_resumed_version_is_its_checkpoints_weights_and_a_dead_branch_counts_its_depth():
    lineage = Lineage(killed_past_its_checkpoint())
    assert lineage.same(7, 5)  # version 5 was published right after the checkpoint
    assert lineage.lag(5, 7) == 0 and lineage.lag(4, 7) == 1 and lineage.lag(4, 8) == 2
    assert lineage.lag(6, 7) == 1  # one sync down the dead branch
    assert lineage.lag(6, 8) == 2 and lineage.lag(6, 9) == 3  # plus the live one's distance
    assert lineage.lag(99, 7) is None


def test_a_checkpoint_between_syncs_resumes_one_update_past_its_version():
    events = [published(0, 0), published(1, 4), published(2, 8)]
    events.append(ev.TrainerResumed(RUN, 3, step=6, checkpoint_version=1, last_logged_version=2))
    events.append(published(3, 6))
    lineage = Lineage(events)
    assert lineage.depth(3) == 2 and not lineage.same(3, 2)
    assert lineage.lag(1, 3) == 1 and lineage.lag(2, 3) == 2


def test_a_window_over_its_stale_share_and_a_sample_past_the_lag_are_counted():
    """max_samples_per_version 3, a window of 2: at most one stale sample a window, lag 1."""
    control = [published(0, 0), published(1, 1), published(2, 2)]
    log = RunLog(
        samples=[*(sample(i, 0) for i in range(3)), sample(3, 1), sample(4, 0), sample(5, 2)],
        control=control,
        steps=[step(1, 0, 0, 1), step(2, 1, 2, 3), step(3, 2, 4, 5)],
    )
    report = audit(log, 3, RUN, samples_per_version=2, max_lag=lag_bound(0.5))
    assert report.violations["over_stale_windows"] == 0
    assert report.violations["over_lag_samples"] == 1  # p4: version 0 trained at version 2
    assert report.info["max_lag"] == 2

    log.steps[1] = step(2, 1, 2, 4)  # two samples of version 0 in version 1's window
    log.steps[2] = step(3, 2, 3, 5)
    report = audit(log, 3, RUN, samples_per_version=2, max_lag=1)
    assert report.violations == {**report.violations, "over_stale_windows": 1}
    assert report.examples["over_stale_windows"] == [
        "version 1 (steps 2-2): 2 stale samples, at most 1"
    ]
    lagged = report.to_dict()["staleness"]["lagged_samples"]
    assert {s["sample_id"] for s in lagged} == {"p2@0", "p4@0", "p3@0"}


def test_refunds_under_the_version_before_raise_a_windows_bound():
    control = [
        published(0, 0),
        ev.SamplesDropped(RUN, 0, worker=ev.TRAINER, target_worker=0, count=1, sample_ids=["x"]),
        published(1, 1),
    ]
    log = RunLog(
        samples=[sample(i, 0) for i in range(4)],
        control=control,
        steps=[step(1, 0, 0, 1), step(2, 1, 2, 3)],
    )
    report = audit(log, 3, RUN, samples_per_version=2, max_lag=1)
    assert report.violations["over_stale_windows"] == 0
    assert report.staleness["windows"][1]["bound"] == 2


def test_the_trainer_drops_a_dead_branchs_samples_past_the_lag_and_stale_ones_past_the_share(
    tmp_path,
):
    """The demo's arithmetic on SMALL's groups: 4 samples a step, at most 6 per version, so 2
    stale a window and lag 1. Queued: version 6 (a dead branch, lag 2 at version 8), then three
    of version 7 (lag 1) and fresh ones: the guard drops the first, keeps two stale, drops the
    third, and each drop is refunded (counted as consumed)."""
    from asyncrl.config import load_config
    from asyncrl.consumers.batcher import SampleBatcher
    from asyncrl.consumers.staleness_guard import StalenessGuard
    from asyncrl.kafka import Record
    from tests.helpers import SMALL

    cfg = load_config(overrides=[*SMALL, f"output_dir={tmp_path}", "run_id=g"])
    guard = StalenessGuard(cfg)
    for event in killed_past_its_checkpoint():
        guard.lineage.feed(event)
    assert (guard.max_lag, guard.max_stale) == (1, 2)
    batcher = SampleBatcher()
    versions = [6, 7, 7, 7, 8, 8, 8]
    for i, v in enumerate(versions):
        s = sample(i, v)
        batcher.offer(Record("x.samples", 0, i, s.sample_id, 0, {}, s), current_version=8)
    dropped = guard.screen(batcher, 4, version=8)
    assert [d.record.value.sample_id for d in dropped] == ["p0@0", "p3@0"]
    assert "lag 2" in dropped[0].reason and "stale" in dropped[1].reason
    assert batcher.consumed[0] == 2
    batch = batcher.take(4)
    guard.trained(batch, 8)
    assert guard.window == (8, 2)
    assert guard.screen(batcher, 0, version=8) == []
