"""One short seed of the chaos run (tests/chaos.py): random faults at random moments during a
mode (d) run with 2 workers, then the run finished and ``asyncrl audit`` is clean, its
per-window staleness check and lag on the lineage included. ``make chaos`` runs many seeds,
longer; a failure prints its seed, and ``python -m tests.chaos --first-seed N --seeds 1``
replays it."""

from __future__ import annotations

import pytest

from tests.chaos import chaos_overrides, chaos_run

# Opt-in (`make test-heavy`, ~30 s): each fault it draws has its own case in `make test`
# (test_faults.py, test_worker_recovery.py, test_kafka_faults.py); `make chaos` runs many seeds.
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.heavy]

SEED = 7


def test_random_faults_during_a_mode_d_run_leave_it_finished_and_its_audit_clean(
    make_run_cfg, quick_policy
):
    cfg = make_run_cfg(*quick_policy, *chaos_overrides(steps=16), create_topics=False)
    cfg.kafka.bootstrap_servers = None  # the launcher's own broker, which the faults stall
    result = chaos_run(cfg, SEED, faults=3, gap_s=(1.0, 4.0))
    print(result.line())
    assert result.ok, (
        f"replay: python -m tests.chaos --first-seed {SEED} --seeds 1 --faults 3 --steps 16",
        result.line(),
    )
