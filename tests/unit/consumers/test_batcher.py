"""The trainer's batcher: FIFO batches, staleness drops, and the offsets a restart resumes at."""

import pytest

from asyncrl.consumers.batcher import SampleBatcher
from asyncrl.kafka import Record
from asyncrl.schemas.sample import Sample, Trajectory


def rec(offset: int, version: int = 0, worker: int = 0, partition: int = 0) -> Record[Sample]:
    t = Trajectory([3], [-0.1], 1.0, param_version=version, param_version_start=version)
    s = Sample(f"s{offset}", f"p{offset}", worker, [1], "1", [t])
    return Record("x.samples", partition, offset, s.sample_id, 0, {}, s)


def test_fifo_batches_and_counts_per_worker():
    b = SampleBatcher()
    for i in range(5):
        b.offer(rec(i, worker=i % 2), current_version=0)
    batch = b.take(3)
    assert [r.offset for r in batch] == [0, 1, 2]
    assert b.consumed == {0: 2, 1: 1}
    assert len(b) == 2


def test_settled_offsets_point_at_the_first_unused_sample():
    b = SampleBatcher()
    for i in range(5):
        b.offer(rec(i), 0)
    b.take(3)
    assert b.settled_offsets() == {0: 3}
    b.take(2)
    assert b.settled_offsets() == {0: 5}


def test_version_lag_drops_are_counted_and_settled():
    b = SampleBatcher(max_version_lag=1)
    assert b.offer(rec(0, version=5), current_version=6) is None
    dropped = b.offer(rec(1, version=4, worker=1), current_version=6)
    assert dropped is not None and "lag 2" in dropped.reason
    assert b.dropped["max_version_lag"] == 1
    assert b.consumed[1] == 1
    assert len(b) == 1


def test_a_sample_queued_past_a_sync_is_dropped_once_the_lag_passes_it():
    """The lag was checked as a sample arrived only: queued, it waited for its step while a
    sync aged it, and a run at max_version_lag=0 trained whole steps of samples one version
    old (fully_async/staleness/count_1 = 8 of 8 at a step). Found by a tuning walkthrough:
    ``expire`` drops them as a step is assembled, counted, settled, and a filtered group
    before one goes to the sample after it."""
    b = SampleBatcher(max_version_lag=0)
    b._filtered_trailing = 2  # two groups filtered before the first sample
    assert b.offer(rec(0, version=3), current_version=3) is None
    assert b.offer(rec(1, version=3, worker=1), current_version=3) is None
    b._filtered_trailing = 1
    assert b.offer(rec(2, version=4), current_version=4) is None
    assert b.expire(3) == []  # nothing aged yet
    dropped = b.expire(4)
    assert [d.record.offset for d in dropped] == [0, 1]
    assert all("version lag 1 > max_version_lag 0 (queued)" in d.reason for d in dropped)
    assert all(d.kind == "max_version_lag" for d in dropped)
    assert b.dropped["max_version_lag"] == 2 and b.consumed == {0: 1, 1: 1}
    assert [r.offset for r in b.buffer] == [2] and b.settled_offsets() == {0: 2}
    assert b.filtered_ahead(1) == 3  # the 2 before the dropped ones and the 1 before it
    assert SampleBatcher().expire(10) == []  # no lag set: nothing expires


def test_state_round_trip_restores_counters_and_offsets():
    b = SampleBatcher()
    for i in range(4):
        b.offer(rec(i, worker=1), 0)
    b.take(2)
    c = SampleBatcher()
    offsets = c.restore(b.state())
    assert offsets == {0: 2}
    assert c.consumed == {1: 2}
    assert len(c) == 0


def test_a_duplicate_sample_id_is_dropped_and_not_counted_as_consumed():
    b = SampleBatcher()
    assert b.offer(rec(0, worker=1), 0) is None
    copy = rec(0, worker=1)
    copy.offset = 7  # the same sample published again further on
    dropped = b.offer(copy, 0)
    assert dropped is not None and dropped.kind == "duplicate"
    assert "offset 0" in dropped.reason
    assert len(b) == 1
    b.take(1)
    assert b.consumed == {1: 1}  # once, not twice
    assert b.dropped["duplicate"] == 1
    late = rec(0, worker=1)
    late.offset = 9  # and after it was trained on
    assert b.offer(late, 0).kind == "duplicate"


def test_settled_ids_survive_a_restart_and_a_reread_is_not_a_duplicate():
    b = SampleBatcher(max_version_lag=1)
    assert b.offer(rec(0, version=3), 3) is None  # queued
    assert b.offer(rec(1, version=0), 3) is not None  # dropped, settled behind a queued one
    assert b.consumed == {0: 1}
    c = SampleBatcher(max_version_lag=1)
    assert c.restore(b.state()) == {0: 0}
    assert "s1" in c.settled and "s0" not in c.settled  # s0 was queued, not settled
    # The restarted trainer re-reads both: s0 is queued again, s1 is skipped, not re-counted.
    assert c.offer(rec(0, version=3), 3) is None
    assert c.offer(rec(1, version=0), 3) is None
    assert len(c) == 1 and c.consumed == {0: 1} and c.dropped == {"max_version_lag": 1}
    copy = rec(0)
    copy.offset = 5  # a copy of s0 further on is a duplicate
    assert c.offer(copy, 3).kind == "duplicate"


def group(offset: int, rewards: list[float], worker: int = 0, **kw) -> Record[Sample]:
    trajs = [Trajectory([3], [-0.1], r, **kw) for r in rewards]
    s = Sample(f"s{offset}", f"p{offset}", worker, [1], "1", trajs)
    return Record("x.samples", 0, offset, s.sample_id, 0, {}, s)


def test_groups_without_signal_are_settled_on_arrival_and_attributed_to_the_next_step():
    from asyncrl.config.offpolicy import FilterGroupsConfig

    b = SampleBatcher(filter_groups=FilterGroupsConfig(enable=True))
    log = [[1, 0], [1, 1], [0, 0], [0, 1], [0, 0], [1, 0], [1, 1]]
    dropped = [b.offer(group(i, r, worker=i % 2), 0) for i, r in enumerate(log)]
    kinds = [d.kind if d else None for d in dropped]
    assert kinds == [
        None,
        "filter_groups",
        "filter_groups",
        None,
        "filter_groups",
        None,
        "filter_groups",
    ]
    assert "every trajectory's score is 1" in dropped[1].reason
    assert len(b) == 3 and b.filtered == 4
    # filtered groups are settled, their offsets passed; not consumed: their workers took
    # their budget slots back as they published them
    assert b.consumed == {}
    assert b.filtered_ahead(2) == 2 and b.filtered_ahead(4) == 4
    assert [r.offset for r in b.take(2)] == [0, 3]
    assert b.consumed == {0: 1, 1: 1}
    assert b.taken_filtered == 2  # offsets 1, 2 came before sample 3
    assert b.settled_offsets() == {0: 5}
    # a restart: the unattributed ones (4, 6) go to the first sample queued again
    c = SampleBatcher(filter_groups=FilterGroupsConfig(enable=True))
    c.restore(b.state())
    assert c.filtered == 4
    assert c.offer(group(5, [1, 0]), 0) is None
    c.take(1)
    assert c.taken_filtered == 2


def test_dynamic_sampling_keeps_singletons_and_reads_the_named_metric():
    import json

    from asyncrl.config.offpolicy import FilterGroupsConfig
    from asyncrl.consumers.dynamic_sampling import filter_metrics, no_signal

    fg = FilterGroupsConfig(enable=True)
    assert no_signal(group(0, [1.0]).value, fg) is None  # a group of one: kept (DAPO)
    # a failed reward leaves one scored trajectory of two: advantage 0, filtered
    failed = group(1, [1.0, 0.0])
    failed.value.trajectories[1].reward_error = "timeout"
    assert no_signal(failed.value, fg) is not None
    acc = FilterGroupsConfig(enable=True, metric="acc")
    s = group(2, [0.5, 0.7]).value  # rewards differ, accuracies do not
    for t in s.trajectories:
        t.reward_extra = json.dumps({"acc": 1.0})
    assert no_signal(s, fg) is None
    assert "every trajectory's acc is 1" in (no_signal(s, acc) or "")
    with pytest.raises(ValueError, match="filter_groups.metric=acc: .* has no 'acc'"):
        no_signal(group(3, [0.5, 0.7]).value, acc)
    m = filter_metrics(filtered=3, kept=4, total=10)
    assert m["train/num_gen_batches"] == 2.0  # 7 read for 4: two generation batches
    assert m["filter_groups/filtered_ratio"] == pytest.approx(3 / 7)
    assert m["fully_async/count/filtered_samples"] == 10.0


def test_filtering_off_leaves_the_checkpoint_state_as_it_was():
    b = SampleBatcher()
    b.offer(group(0, [1, 1]), 0)
    assert len(b) == 1 and "filtered" not in b.state()


def test_a_stale_group_without_signal_is_filtered_not_dropped_for_its_lag():
    """Its worker took the slot back as it published it: a max_version_lag drop would count it
    consumed and refund the slot a second time."""
    from asyncrl.config.offpolicy import FilterGroupsConfig

    b = SampleBatcher(max_version_lag=1, filter_groups=FilterGroupsConfig(enable=True))
    flat, kept = group(0, [1, 1], param_version=0), group(1, [1, 0], param_version=0)
    assert b.offer(flat, current_version=5).kind == "filter_groups"
    assert b.offer(kept, current_version=5).kind == "max_version_lag"
    assert b.consumed == {0: 1}


def test_a_token_id_past_the_vocabulary_is_dropped_and_settled():
    """A sample holding a token id the policy has no embedding for failed the update with an
    index error, and failed a restarted trainer the same way: it is dropped, its worker's
    budget refunded, the next sample queued."""
    b = SampleBatcher(vocab_size=4)
    bad = rec(0, worker=1)  # response token 3 < 4, prompt token 1
    bad.value.trajectories[0].response_ids = [3, 9]
    bad.value.trajectories[0].response_logprobs = [-0.1, -0.2]
    bad.value.trajectories[0].response_mask = [1, 1]
    dropped = b.offer(bad, current_version=0)
    assert dropped is not None and dropped.kind == "invalid"
    assert "token id 9 outside the policy's vocabulary (4 ids)" in dropped.reason
    assert b.consumed == {1: 1} and b.dropped == {"invalid": 1}
    assert b.offer(rec(1), current_version=0) is None and len(b) == 1


def prompt_rec(offset: int, prompt: int, epoch: int, version: int = 0) -> Record[Sample]:
    """A sample with a real id, ``<prompt id>@<epoch>``."""
    t = Trajectory([3], [-0.1], 1.0, param_version=version, param_version_start=version)
    s = Sample(f"p{prompt}@{epoch}", f"p{prompt}", 0, [1], "1", [t])
    return Record("x.samples", 0, offset, s.sample_id, 0, {}, s)


def test_the_settled_ids_stay_bounded_over_a_long_run_and_a_late_copy_is_still_dropped():
    """Every id settled was kept with its place, so the trainer grew by ~200 bytes a sample
    for the whole run (and each checkpoint wrote them all). Kept per prompt now: 4,000 steps
    of 8 samples over 40 prompts (800 epochs, a few samples trained out of order and some
    dropped for their lag) hold what 500 steps held. A copy of a sample of the first epoch
    that arrives at the end, or after a restart, is still a duplicate."""
    import json

    b = SampleBatcher(max_version_lag=2)
    prompts, per_step, offset = 40, 8, 0
    sizes = {}
    for step in range(1, 4001):
        version = step // 4
        for _ in range(per_step):
            k = offset + (1 if offset % 50 == 0 else -1 if offset % 50 == 1 else 0)  # swapped
            stale = version - 3 if offset % 97 == 0 else version  # dropped for its lag
            b.offer(prompt_rec(offset, k % prompts, k // prompts, stale), version)
            offset += 1
        b.take(min(len(b), per_step))
        if step in (500, 4000):
            sizes[step] = len(json.dumps(b.state()))  # what a checkpoint writes
    assert sizes[4000] <= sizes[500] * 1.1, sizes  # was 8x: 16K ids against 2K
    assert b.settled.entries() <= prompts + 8 and len(b.settled_at) <= 8
    assert len(b.settled) == offset - len(b)  # every id settled, none forgotten
    assert b.dropped["max_version_lag"] > 300
    late = prompt_rec(offset, prompt=3, epoch=0)  # trained at the first step
    dropped = b.offer(late, current_version=1000)
    assert dropped is not None and dropped.kind == "duplicate"
    restarted = SampleBatcher(max_version_lag=2)
    restarted.restore(json.loads(json.dumps(b.state())))
    assert restarted.offer(prompt_rec(offset + 1, prompt=7, epoch=1), 1000).kind == "duplicate"
    fresh = prompt_rec(offset + 2, prompt=7, epoch=900, version=1000)
    assert restarted.offer(fresh, 1000) is None


def test_a_sample_above_the_trainers_version_is_dropped_as_never_granted():
    """A sample with param_version 10**9 (a forged or corrupted record) was queued and
    trained (its lag negative, never past max_version_lag); only ``audit`` flagged it. No
    sync ever granted a version above the trainer's own (a restarted trainer takes one above
    the control log's highest before it reads samples), so it is dropped as invalid and its
    worker's slot counted. A record ``replay topic`` copied from another run keeps its run's
    versions and is taken."""
    b = SampleBatcher(max_version_lag=2)
    assert b.offer(rec(0, version=3), current_version=3) is None  # the current version
    dropped = b.offer(rec(1, version=10**9, worker=1), current_version=3)
    assert dropped is not None and dropped.kind == "invalid"
    assert dropped.reason == (
        "param_version 1000000000 is above the trainer's version 3: no sync granted it "
        "(a forged or corrupted record)"
    )
    assert (b.dropped["invalid"], b.consumed[1], len(b)) == (1, 1, 1)
    replayed = rec(2, version=7)
    replayed.headers["replayed-from"] = b"other.samples"
    assert b.offer(replayed, current_version=3) is None
    assert len(b) == 2
