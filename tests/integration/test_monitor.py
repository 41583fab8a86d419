"""``asyncrl monitor`` against a real run's topics: its aggregates agree with the log."""

from __future__ import annotations

import io
import uuid
from collections import Counter

import pytest
from rich.console import Console

from asyncrl.launch.launcher import run
from asyncrl.ops.monitor import monitor
from asyncrl.schemas import control as ev
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def finished_run(broker, quick_policy, tmp_path_factory):
    """One finished 4-step run (mode d) that each engine's monitor reads from the beginning.
    The monitors only read it (the plain reader has no consumer group, faust a fresh one of
    its own), so one run serves both: a run each was the same run twice."""
    from asyncrl.config import load_config
    from tests.helpers import on_session_broker

    cfg = load_config(
        overrides=[
            f"run_id=t{uuid.uuid4().hex[:8]}",
            *on_session_broker(broker),
            f"output_dir='{tmp_path_factory.mktemp('monitored') / 'runs'}'",
            *quick_policy,
            "actor_rollout_ref.rollout.name=sim",
            "data.max_response_length=64",
            "actor_rollout_ref.rollout.n=4",
            "async_training.staleness_threshold=0.5",
            "async_training.partial_rollout=true",
            "trainer.total_training_steps=4",
            "trainer.test_freq=0",
            "trainer.target_accuracy=null",
        ]
    )
    run(cfg, Console(file=io.StringIO()))
    return cfg


@pytest.mark.parametrize("engine", ["faust", "kafka"])
def test_monitor_agrees_with_the_log(finished_run, engine, tmp_path, monkeypatch):
    cfg = finished_run
    out = io.StringIO()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # the monitor must leave nothing in the working directory
    # follow=True: returns by itself, having seen RunFinished and read everything
    mon = monitor(
        cfg,
        cfg.kafka.bootstrap_servers,
        Console(file=out, width=200),
        idle_exit_s=30,
        engine=engine,
    )

    samples = [r.value for r in read_topic(cfg, "samples")]
    steps = [r.value for r in read_topic(cfg, "steps")]
    assert mon.finished == "total_training_steps reached"
    assert mon.published == len(samples)
    assert mon.trained == sum(len(s.sample_ids) for s in steps) == 4 * cfg.required_samples
    assert mon.steps == 4
    assert mon.lag == len(samples) - mon.trained - mon.dropped
    produced = Counter(s.param_version for s in samples)
    assert {v: st.produced for v, st in mon.versions.items() if st.produced} == dict(produced)
    consumed = Counter()
    for s in steps:
        consumed[s.version] += len(s.sample_ids)
    assert {v: st.consumed for v, st in mon.versions.items() if st.consumed} == dict(consumed)
    for st in mon.versions.values():
        assert sum(st.staleness.values()) == st.consumed
        assert st.stale == sum(n for k, n in st.staleness.items() if k > 0)
    # Stale counts against the log: per version by the oldest token (the monitor's), and
    # verl's running total by the last token (version - param_version_end >= 1).
    by_id = {s.sample_id: s for s in samples}
    stale_at, verl_stale = Counter(), 0
    for step in steps:
        trained = [by_id[i] for i in step.sample_ids]
        stale_at[step.version] += sum(1 for s in trained if step.version > s.param_version)
        verl_stale += sum(1 for s in trained if step.version > s.param_version_end)
        assert step.metrics["fully_async/count/stale_samples_processed"] == verl_stale
    assert {v: st.stale for v, st in mon.versions.items() if st.stale} == {
        v: n for v, n in stale_at.items() if n
    }
    # A RolloutResumed closes the window of the version before it: its ratios are that one's.
    control = [r.value for r in read_topic(cfg, "control")]
    resumed = [e for e in control if isinstance(e, ev.RolloutResumed) and e.worker == 0]
    idle = {e.version - 1: e.idle_ratio for e in resumed if e.version > 0}
    assert {v: st.rollouter_idle[0] for v, st in mon.versions.items() if st.rollouter_idle} == idle
    full = {e.version - 1: e.engine_occupancy for e in resumed if e.version > 0}
    assert {
        v: st.engine_occupancy[0] for v, st in mon.versions.items() if st.engine_occupancy
    } == full
    assert all(0 <= x <= 1 for x in full.values())
    assert mon.workers and mon.dead_letters == 0
    assert "per weight version" in out.getvalue()
    assert list(cwd.iterdir()) == []  # faust's data directory was a temporary one


def test_the_monitor_ends_when_the_runs_embedded_broker_ends_with_it(quick_policy, tmp_path):
    """``asyncrl run``'s broker dies at the run's end. The faust monitor, still behind, retried
    it for ever, ten errors a second, and neither SIGTERM nor Ctrl-C stopped it. The plain
    reader ended, but printed a librdkafka FAIL warning for the broker's going, every time.
    One monitor of each engine watches the same run (each reads without moving anyone's
    offsets; the faust one in a fresh group of its own), so one run serves both."""
    import subprocess
    import sys
    import time

    asyncrl = [sys.executable, "-m", "asyncrl"]
    run_dir = tmp_path / "gone"
    launcher = subprocess.Popen(
        [
            *asyncrl,
            "run",
            "run_id=gone",
            f"output_dir={tmp_path}",
            *quick_policy,
            "trainer.total_training_steps=40",
            "trainer.target_accuracy=null",
            "trainer.test_freq=0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watchers: dict[str, subprocess.Popen] = {}
    logs = {engine: tmp_path / f"monitor-{engine}.log" for engine in ("faust", "kafka")}
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the broker is up and the trainer has started
        for engine, log in logs.items():
            with log.open("w") as out:
                watchers[engine] = subprocess.Popen(
                    [*asyncrl, "monitor", str(run_dir), "--engine", engine],
                    stdout=out,
                    stderr=out,
                )
        assert launcher.wait(120) == 0
        deadline = time.monotonic() + 45
        for engine, watcher in watchers.items():
            try:
                code = watcher.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None  # still running: its log says where it was
            assert code == 0, (engine, logs[engine].read_text()[-2000:])
    finally:
        for watcher in watchers.values():
            if watcher.poll() is None:
                watcher.kill()
        if launcher.poll() is None:
            launcher.kill()
    for engine, log in logs.items():
        text = log.read_text()
        assert "per weight version" in text, (engine, text[-2000:])
        assert "Unable connect" not in text and "Traceback" not in text, (engine, text[-2000:])
        assert "librdkafka" not in text and "WARNING" not in text, (engine, text[:2000])
