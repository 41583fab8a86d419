"""The per-version rollout budget (docs/design.md, "Versions and the budget")."""

import pytest

from asyncrl.producers.budget import RolloutBudget, num_stale_at_sync, worker_share


@pytest.mark.parametrize("total, workers", [(12, 1), (12, 5), (7, 3), (2, 4), (0, 2)])
def test_shares_add_up_to_the_budget(total, workers):
    shares = [worker_share(total, workers, i) for i in range(workers)]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_worker_id_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        worker_share(10, 2, 2)


def test_staleness_zero_budget_is_exact():
    # trigger=2, required=4, staleness 0: exactly 8 per version, no stale samples at a sync.
    b = RolloutBudget(max_per_version=8)
    assert b.reset(version=0, num_stale=0) == 8
    assert sum(b.take() for _ in range(20)) == 8
    assert b.remaining == 0


def test_stale_samples_are_subtracted():
    # (1 + 0.5) x 1 x 8 = 12 per version; 4 left unconsumed at the sync -> 8 new ones.
    b = RolloutBudget(max_per_version=12)
    b.reset(0, 0)
    assert sum(b.take() for _ in range(12)) == 12
    stale = num_stale_at_sync(produced=12, consumed=8)
    assert stale == 4
    assert b.reset(1, stale) == 8
    assert b.version == 1 and b.started == 0


def test_more_stale_than_share_gives_zero_not_negative():
    b = RolloutBudget(max_per_version=6, num_workers=2, worker_id=1)
    assert b.reset(3, num_stale=10) == 0
    assert not b.take()


def test_refund_after_drops_lets_the_worker_refill():
    b = RolloutBudget(max_per_version=4)
    b.reset(0, 0)
    for _ in range(4):
        b.take()
    assert not b.take()
    b.refund(2)
    assert b.take() and b.take() and not b.take()


def test_num_stale_counts_in_flight_and_partials():
    assert num_stale_at_sync(produced=10, consumed=10, in_flight=3, partial=2) == 5
    assert num_stale_at_sync(produced=5, consumed=7) == 0


def test_shares_follow_the_members_of_the_sync():
    """A version of 10 samples among members 0, 1, 4 (worker 4 added mid-run): 4 + 3 + 3; a
    worker not among the members (left, or added after the sync) gets nothing."""
    shares = {
        w: RolloutBudget(max_per_version=10, num_workers=2, worker_id=w).reset(3, 0, [4, 0, 1])
        for w in (0, 1, 4)
    }
    assert shares == {0: 4, 1: 3, 4: 3} and sum(shares.values()) == 10
    assert RolloutBudget(max_per_version=10, num_workers=2, worker_id=2).reset(3, 0, [0, 1]) == 0
    # One member left: the other takes the whole version, less its stale samples.
    assert RolloutBudget(max_per_version=10, num_workers=2, worker_id=1).reset(4, 3, [1]) == 7
