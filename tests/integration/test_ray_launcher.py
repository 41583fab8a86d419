"""``asyncrl run --launcher ray`` on a local Ray (the machine's 2 CPUs): the same run, learning."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from asyncrl.launch.launcher import run
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_ray_run_completes_and_learns(make_run_cfg, demo_policy):
    cfg = make_run_cfg(
        *demo_policy,
        "launcher=ray",
        "ray.num_cpus=2",  # trainer 1 CPU + one rollout worker 1 CPU
        "trainer.total_training_steps=30",
        "trainer.test_freq=10",
        create_topics=False,
    )
    out = io.StringIO()
    summary = run(cfg, Console(file=out, width=160))
    assert "launcher: Ray actors" in out.getvalue()
    assert summary["step"] == 30 and summary["reason"] == "total_training_steps reached"
    assert summary["val/accuracy"] > summary["val/accuracy_initial"] + 0.1
    # The roles really ran, through the log: every step trained on samples of the worker.
    steps = [r.value for r in read_topic(cfg, "steps")]
    assert len(steps) == 30
    assert (cfg.run_dir / "logs" / "rollout-0.log").read_text().count("produced") == 1


def test_a_ray_role_is_told_to_stop_not_killed(make_run_cfg, tmp_path):
    """A stopped `asyncrl run --launcher ray` SIGTERMs its roles as the local launcher does
    (the trainer then checkpoints its last step); ``terminate`` was ``ray.kill``, which killed
    them where they stood. A broker role shows it: SIGTERM ends it with 0, a kill with -9."""
    import time

    from asyncrl.launch.ray_launcher import RayLauncher

    # No worker: the trainer's bundle holds one CPU of two, the broker's actor the other.
    cfg = make_run_cfg(
        "launcher=ray",
        "ray.num_cpus=2",
        "actor_rollout_ref.rollout.num_workers=0",
        create_topics=False,
    )
    launcher = RayLauncher(cfg)
    try:
        proc, log = launcher.spawn(
            "broker", [sys.executable, "-m", "asyncrl", "broker"], tmp_path / "broker.log"
        )
        deadline = time.monotonic() + 120
        while not (log.exists() and "Ctrl-C to stop" in log.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the role never started"
            time.sleep(0.2)
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        launcher.close()
