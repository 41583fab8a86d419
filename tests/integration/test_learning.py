"""The demo learns: `asyncrl run` with the shipped config lifts held-out accuracy by a clear margin.

Rollout and training run in separate processes over the real broker, in mode (c)
(staleness_threshold 0.5, a sync after every step), exactly as ``make run`` runs them.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from asyncrl.launch.launcher import run
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_async_grpo_lifts_held_out_accuracy(make_run_cfg, demo_policy):
    # Stopped at 0.8 (the demo stops at 0.9): the lift asserted below, in fewer steps.
    cfg = make_run_cfg(
        *demo_policy, "trainer.total_training_steps=250", "trainer.target_accuracy=0.8"
    )
    summary = run(cfg, Console(file=io.StringIO(), width=120))

    initial, final = summary["val/accuracy_initial"], summary["val/accuracy"]
    assert initial < 0.5, f"the warm start should leave room for RL (initial {initial:.2f})"
    assert final >= 0.8, f"held-out accuracy only reached {final:.2f} (from {initial:.2f})"
    assert final - initial >= 0.3

    steps = [r.value for r in read_topic(cfg, "steps")]
    assert len(steps) == summary["step"]
    stale = steps[-1].metrics["fully_async/count/stale_samples_processed"]  # a running total
    assert stale > 0, "mode (c) trains on samples of the previous version too"
