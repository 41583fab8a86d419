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


def test_a_worker_waiting_for_a_trainer_stops_when_told(make_run_cfg, quick_policy):
    """Two workers of one run wait side by side: worker 0 is sent SIGTERM, worker 1 Ctrl-C's
    SIGINT. (Each was a run of its own: the same wait, and a worker's start-up paid twice.)"""
    cfg = make_run_cfg(*quick_policy, f"sync.master_port={free_port()}")
    _, config = prepare(cfg, cfg.kafka.bootstrap_servers, Console(file=StringIO()))
    told = {0: (signal.SIGTERM, 143), 1: (signal.SIGINT, 130)}
    workers = {
        i: subprocess.Popen(
            [sys.executable, "-m", "asyncrl", "rollout", "--config", str(config)]
            + ["--worker-id", str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        for i in told
    }
    outs: dict[int, str] = {}
    try:
        _wait_until_announced(cfg, workers)  # their signal handlers are in place from then on
        for i, (sig, _) in told.items():
            workers[i].send_signal(sig)
        for i, worker in workers.items():
            outs[i], _ = worker.communicate(timeout=30)
    finally:
        for worker in workers.values():
            worker.kill()
    for i, (sig, code) in told.items():
        assert workers[i].returncode == code, (sig.name, outs[i][-2000:])
        assert "stopped while waiting to join the trainer" in outs[i], sig.name
        assert "Traceback" not in outs[i], sig.name


def _wait_until_announced(
    cfg, workers: dict[int, subprocess.Popen], timeout_s: float = 120.0
) -> None:
    """Until each worker's WorkerStarted is on the control topic: they wait for the trainer.
    (A fixed 8 s sleep signalled a worker still importing torch on a loaded machine, which
    died of the default SIGTERM action, -15.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for i, worker in workers.items():
            assert worker.poll() is None, f"worker {i} exited before it announced itself"
        events = [r.value for r in read_topic(cfg, "control")]
        started = {e.worker for e in events if isinstance(e, ev.WorkerStarted)}
        if started >= set(workers):
            return
        time.sleep(0.5)
    raise AssertionError(
        f"workers {sorted(workers)} did not all announce themselves in {timeout_s} s"
    )
