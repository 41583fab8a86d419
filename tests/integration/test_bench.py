"""Benchmarks run in CI only at smoke size: they must work, their figures are not asserted."""

import io

import pytest
from rich.console import Console

from asyncrl.ops.bench import sync_pause

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_sync_pause_smoke(broker, tmp_path, quick_policy):
    out = io.StringIO()
    result = sync_pause(
        None,
        [
            *quick_policy,
            f"kafka.bootstrap_servers='{broker}'",
            f"output_dir='{tmp_path}'",
            "trainer.total_training_steps=3",
        ],
        Console(file=out, width=160),
    )
    assert set(result) == {"c", "d", "pause_ratio_c_over_d"}
    assert result["c"]["syncs"] == result["d"]["syncs"] == 2
    assert result["c"]["partial_samples"] == 0  # mode (c) never interrupts
    assert "mean sync pause" in out.getvalue()


def test_modes_smoke(broker, tmp_path, quick_policy):
    from asyncrl.ops.bench_modes import modes

    out = io.StringIO()
    results = modes(
        None,
        [*quick_policy, f"kafka.bootstrap_servers='{broker}'", f"output_dir='{tmp_path}'"],
        Console(file=out, width=200),
        steps=2,
        ablation=False,
    )
    assert list(results) == [
        "colocated sync",
        "(a) on-policy pipeline",
        "(b) stream off-policy",
        "(c) stale samples",
        "(d) partial rollout",
    ]
    assert results["(a) on-policy pipeline"]["local_updates"] == 2
    assert results["(d) partial rollout"]["local_updates"] == 8  # 2 sync windows of 4 updates
    assert all(r["ideal_s"] > 0 and r["total_s"] > 0 for r in results.values())
    assert results["(b) stream off-policy"]["stale_samples"] == 0  # staleness 0: none
    assert "speedup over colocated sync" in out.getvalue()
    assert list(tmp_path.glob("bench-modes-*.json"))
