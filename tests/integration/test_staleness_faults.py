"""The staleness bound through a trainer restart: the demo's cadence (a sync every 4 steps,
8 samples a step, ``staleness_threshold=0.5``: at most 16 stale samples of a window's 32, lag
at most 1), a checkpoint every 5 steps, and the trainer SIGKILLed as it syncs version 6, so
it dies having published versions past its checkpoint. ``asyncrl audit`` counts stale samples
per window and lag on the version lineage (``ops/audit_staleness.py``)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from asyncrl.kafka import Reader
from asyncrl.ops.audit import audit_run
from asyncrl.schemas import control as ev
from tests.helpers import check_log_invariants
from tests.integration.test_faults import _run_with_fault

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _kill_at_sync(
    cfg, pids: dict[str, int], name: str, version: int, kind: type, out: dict
) -> None:
    """SIGKILL process ``name`` once ``kind(version)`` (SyncRequested: mid-sync;
    WeightsPublished: the version is out) is on control."""
    deadline = time.monotonic() + 300
    while not (cfg.run_dir / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    with Reader(cfg.kafka, cfg.kafka.bootstrap_servers, ev.decode_event) as control:
        control.assign(cfg.topic("control"))
        while time.monotonic() < deadline:
            for rec in control.poll(0.05):
                if isinstance(rec.value, kind) and rec.value.version == version:
                    out["killed_at"] = time.time()
                    os.kill(pids[name], signal.SIGKILL)
                    return


def test_a_trainer_killed_at_a_sync_past_its_checkpoint_keeps_every_window_in_the_bound(
    make_run_cfg, quick_policy
):
    """Killed once version 6 is out: the checkpoint (step 20) is version 5's weights, version
    6 a dead branch. Before the trainer screened what it trains (consumers/staleness_guard.py)
    the audit counted version 6's samples trained at lag 2 and two windows over the bound (32
    and 19 stale of 16): the rejoining worker's sync came off the cadence (steps 27-28), and the
    budget it had opened for a whole window was trained as stale in the next."""
    kind = ev.WeightsPublished
    cfg = make_run_cfg(
        *quick_policy,
        "async_training.trigger_parameter_sync_step=4",  # the demo's, not quick_policy's 1
        "trainer.total_training_steps=60",
        "trainer.save_freq=5",
        "trainer.test_freq=0",
        "trainer.target_accuracy=null",
    )
    summary, killed, _out = _run_with_fault(cfg, _kill_at_sync, "trainer", 6, kind, join_s=300)
    assert killed, "the trainer was never killed"
    assert summary["step"] == 60
    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    windows = [(w["version"], w["steps"][0], w["stale"]) for w in report.staleness["windows"]]
    print(
        f"STALENESS trainer SIGKILL at {kind.__name__}(6): windows (version, first step, "
        f"stale) {windows}; {report.violations}"
    )
    info = check_log_invariants(cfg)  # over_stale_windows and over_lag_samples among them
    print(
        f"STALENESS trainer SIGKILL at the sync of version 6: max stale per window "
        f"{info['max_stale_per_window']} (bound 16), max lag {info['max_lag']}"
    )
    assert info["trainer_restarts"] == 1
    assert info["max_stale_per_window"] <= 16 and info["max_lag"] <= 1
