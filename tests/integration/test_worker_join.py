"""A rollout worker waiting to join a trainer (none started yet, role by role) stops when it
is told to: it waited for the trainer's store for sync.timeout_s, deaf to SIGTERM and Ctrl-C
(a helper's walkthrough had to SIGKILL it, and one SIGTERMed as the run ended exited 305 s
later with a traceback)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from rich.console import Console

from asyncrl.launch.broker import free_port
from asyncrl.launch.setup import prepare
from asyncrl.schemas import control as ev
from tests.helpers import read_topic

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_worker_waiting_for_a_trainer_stops_when_told(make_run_cfg, quick_policy, sig):
    cfg = make_run_cfg(*quick_policy, f"sync.master_port={free_port()}")
    _, config = prepare(cfg, cfg.kafka.bootstrap_servers, Console(file=StringIO()))
    worker = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "rollout", "--config", str(config), "--worker-id", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_until_announced(cfg, worker)  # its signal handlers are in place from then on
        worker.send_signal(sig)
        out, _ = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == (143 if sig == signal.SIGTERM else 130), out[-2000:]
    assert "stopped while waiting to join the trainer" in out
    assert "Traceback" not in out


def _wait_until_announced(cfg, worker: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until the worker's WorkerStarted is on the control topic: it waits for the trainer.
    (A fixed 8 s sleep signalled a worker still importing torch on a loaded machine, which
    died of the default SIGTERM action, -15.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert worker.poll() is None, "the worker exited before it announced itself"
        events = [r.value for r in read_topic(cfg, "control")]
        if any(isinstance(e, ev.WorkerStarted) and e.worker == 0 for e in events):
            return
        time.sleep(0.5)
    raise AssertionError(f"worker 0 did not announce itself in {timeout_s} s")
