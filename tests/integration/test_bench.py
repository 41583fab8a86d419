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
