"""The trainer's batcher: FIFO batches, staleness drops, and the offsets a restart resumes at."""

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
    assert set(c.seen) == {"s1"}  # s0 was queued, not settled
    # The restarted trainer re-reads both: s0 is queued again, s1 is skipped, not re-counted.
    assert c.offer(rec(0, version=3), 3) is None
    assert c.offer(rec(1, version=0), 3) is None
    assert len(c) == 1 and c.consumed == {0: 1} and c.dropped == {"max_version_lag": 1}
    copy = rec(0)
    copy.offset = 5  # a copy of s0 further on is a duplicate
    assert c.offer(copy, 3).kind == "duplicate"
