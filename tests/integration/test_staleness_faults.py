"""The staleness bound through a trainer restart: the demo's cadence (a sync every 4 steps,
8 samples a step, ``staleness_threshold=0.5``: at most 16 stale samples of a window's 32, lag
at most 1), a checkpoint every 5 steps, and the trainer SIGKILLed as it syncs version 6, so
it dies having published versions past its checkpoint. ``asyncrl audit`` counts stale samples
per window and lag on the version lineage (``ops/audit_staleness.py``). One run of
``python -m tests.staleness_kill``, which runs as many as asked."""

from __future__ import annotations

import pytest

from tests.helpers import check_log_invariants
from tests.staleness_kill import BOUND, kill_run, overrides

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_trainer_killed_at_a_sync_past_its_checkpoint_keeps_every_window_in_the_bound(
    make_run_cfg, quick_policy
):
    """Killed once version 6 is out: the checkpoint (step 20) is version 5's weights, version
    6 a dead branch. Before the trainer screened what it trains (consumers/staleness_guard.py)
    the audit counted version 6's samples trained at lag 2 and two windows over the bound (32
    and 19 stale of 16): the rejoining worker's sync came off the cadence (steps 27-28), and the
    budget it had opened for a whole window was trained as stale in the next."""
    cfg = make_run_cfg(*quick_policy, *overrides())  # the demo's sync every 4, not quick's 1
    result = kill_run(cfg)
    print(result.line())
    assert result.killed, "the trainer was never killed"
    assert result.step == 60
    info = check_log_invariants(cfg)  # over_stale_windows and over_lag_samples among them
    assert info["trainer_restarts"] == 1
    assert info["max_stale_per_window"] <= BOUND and info["max_lag"] <= 1
