"""`asyncrl replay step`: a step re-run from the log reproduces what was recorded."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from asyncrl.ops.config import load_config
from asyncrl.ops.launcher import run
from asyncrl.ops.replay import ReplayError, replay_step

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_step_replay_is_exact_and_a_changed_lr_differs(make_run_cfg, demo_policy):
    cfg = make_run_cfg(
        *demo_policy,
        "trainer.total_training_steps=4",
        "trainer.save_freq=1",
        "trainer.keep_checkpoints=10",
        "trainer.test_freq=0",
    )
    run(cfg, Console(file=io.StringIO()))
    bootstrap = cfg.kafka.bootstrap_servers
    # As a user would: the run's own resolved config, plus overrides.
    run_cfg = cfg.run_dir / "config.yaml"

    for step in (1, 3):
        same = replay_step(load_config(run_cfg), bootstrap, step, Console(file=io.StringIO()))
        assert same["weights_equal"], f"step {step}: max |diff| {same['weights_max_abs_diff']}"
        for key, m in same["metrics"].items():
            assert m["replayed"] == m["recorded"], key

    changed_cfg = load_config(run_cfg, ["actor_rollout_ref.actor.optim.lr=0.01"])
    changed = replay_step(changed_cfg, bootstrap, 3, Console(file=io.StringIO()))
    assert not changed["weights_equal"]
    assert changed["weights_max_abs_diff"] > 1e-4

    # Starting from the wrong state is refused (step 3 from step 1's checkpoint).
    (cfg.run_dir / "checkpoints" / "step_000002").rename(cfg.run_dir / "checkpoints" / "moved")
    (cfg.run_dir / "checkpoints" / "step_000001").rename(
        cfg.run_dir / "checkpoints" / "step_000002"
    )
    with pytest.raises(ReplayError, match="differ from those it started from"):
        replay_step(load_config(run_cfg), bootstrap, 3, Console(file=io.StringIO()))

    with pytest.raises(ReplayError, match="not on"):
        replay_step(load_config(run_cfg), bootstrap, 99, Console(file=io.StringIO()))
