"""A trainer told to stop (SIGTERM: ``docker compose stop``, ``kill``; a first Ctrl-C) stops
between two steps with a checkpoint of the last one, so its restart trains no step again.
Before, it died where it stood: the steps since its last ``save_freq`` checkpoint were voided
by the restart and trained again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from rich.console import Console

from asyncrl.consumers.checkpoint import latest_checkpoint
from asyncrl.consumers.trainer import Trainer
from asyncrl.kafka import Publisher, Reader
from asyncrl.launch.setup import prepare
from asyncrl.ops.audit import audit_run
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.sample import TAG, encode_sample
from asyncrl.schemas.step import decode_step
from tests.integration.test_trainer_restart import TRAINER_ALONE, synthetic_sample

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _publish(cfg, ids: range) -> None:
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        for i in ids:
            sample = encode_sample(synthetic_sample(i))
            pub.publish(cfg.topic("samples"), f"s{i}", sample, {SCHEMA_HEADER: TAG})


def _wait_for_step(cfg, step: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    with Reader(cfg.kafka, cfg.kafka.bootstrap_servers, decode_step) as steps:
        steps.assign(cfg.topic("steps"))
        while time.monotonic() < deadline:
            if any(r.value.step >= step for r in steps.poll(0.1)):
                return
    raise AssertionError(f"no step {step} within {timeout_s} s")


def test_a_stopped_trainer_checkpoints_its_last_step_and_its_restart_trains_none_again(
    make_run_cfg, quick_policy
):
    """Stopped by SIGTERM after step 3, its restart stopped by Ctrl-C's SIGINT after step 4,
    then started again to step 5. (Each signal was a run of its own, resumed to its end: the
    same resume twice.)"""
    cfg = make_run_cfg(
        *quick_policy,
        *TRAINER_ALONE,
        "trainer.save_freq=0",  # no checkpoint but the stops'
        "trainer.total_training_steps=5",
    )
    _, config = prepare(cfg, cfg.kafka.bootstrap_servers, Console(file=StringIO()))
    _publish(cfg, range(12))  # three steps of 4, then it waits for samples
    _stop_the_trainer_after(cfg, config, 3, signal.SIGTERM)
    _publish(cfg, range(12, 16))  # the restarted trainer's step 4
    _stop_the_trainer_after(cfg, config, 4, signal.SIGINT)

    _publish(cfg, range(16, 20))
    again = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        assert again.step == 4
        assert again.run()["step"] == 5
    finally:
        again.close()
    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    assert report.ok, report.violations
    assert report.info["steps"] == 5 and report.info["steps_void"] == 0


def _stop_the_trainer_after(cfg, config, step: int, sig: signal.Signals) -> None:
    """``asyncrl train`` as a process, sent ``sig`` while it waits for the samples of the step
    after ``step``: it exits 143 (SIGTERM) or 130 (SIGINT) with a checkpoint of ``step``."""
    trainer = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "train", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for_step(cfg, step)
        time.sleep(1.0)  # waiting for the next step's samples
        trainer.send_signal(sig)
        out, _ = trainer.communicate(timeout=60)
    finally:
        trainer.kill()
    assert trainer.returncode == (143 if sig == signal.SIGTERM else 130), out[-3000:]
    assert f"after step {step}, version" in out and "Traceback" not in out, out[-3000:]
    assert latest_checkpoint(cfg.run_dir).name == f"step_{step:06d}"
