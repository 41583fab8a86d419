"""bench modes' set-up (bench/modes.py): the setups a workload compares, and their configs."""

from __future__ import annotations

from asyncrl.bench.modes import _setup_overrides, make_workload
from asyncrl.config import load_config


def test_the_long_tail_workload_compares_modes_a_to_d_each_in_its_own_mode() -> None:
    """One async run per mode, (a) to (d) in order, each setup's config in that mode with the
    workload's batch per version (the smoke test in tests/integration runs (a), (b) and (d):
    (c) goes through the same run and row code as (b), one staleness_threshold apart)."""
    w = make_workload("long-tail", None, [], 0.01)
    assert list(w.setups) == [
        "(a) on-policy pipeline",
        "(b) stream off-policy",
        "(c) stale samples",
        "(d) partial rollout",
    ]
    for name, setup in w.setups.items():
        cfg = load_config(None, [*w.overrides, *_setup_overrides(w, setup)])
        assert cfg.async_training.mode == name[1], name
        assert cfg.samples_per_version == w.batch, name
