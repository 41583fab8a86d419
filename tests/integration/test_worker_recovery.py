"""A rollout worker killed with SIGKILL mid-run is restarted by ``asyncrl run`` and recovers its
work from the log: it continues the partial samples it had logged, does not generate again what
it had published, and at the end every prompt taken is one sample or one logged drop."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from asyncrl.kafka import Reader
from asyncrl.launch.launcher import run
from asyncrl.schemas import control as ev
from tests.helpers import committed_prompt_ids, read_topic, report_recovery

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STEPS = 8
# Two samples at a time, 0.1 s per decoding step and a sync after every 4 samples: each sync
# interrupts generations, and their continuation takes long enough to be caught mid-way.
MODE_D = [
    "async_training.staleness_threshold=0.5",
    "async_training.partial_rollout=true",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=2",
    "actor_rollout_ref.rollout.emulated_decode_latency_s=0.1",
    "trainer.test_freq=0",
    f"trainer.total_training_steps={STEPS}",
]


def _kill_with_unfinished_partials(
    cfg, stop: threading.Event, out: dict, pids: dict[str, int]
) -> None:
    """Freeze the worker right after a sync interrupted samples; SIGKILL it if one of them is
    still unfinished on the log (else let it go on and try at the next sync)."""
    bootstrap = cfg.kafka.bootstrap_servers
    config_path = cfg.run_dir / "config.yaml"
    with Reader(cfg.kafka, bootstrap, ev.decode_event) as control:
        while not config_path.exists():  # written after the topics are created
            time.sleep(0.1)
        control.assign(cfg.topic("control"))
        while not stop.is_set():
            paused = [
                r.value
                for r in control.poll(0.05)
                if isinstance(r.value, ev.RolloutPaused) and r.value.n_partial > 0
            ]
            pid = pids.get("rollout-0") if paused else None  # from the launcher
            if pid is None:
                continue
            os.kill(pid, signal.SIGSTOP)
            published = {r.key for r in _raw(cfg, "samples")}
            logged = {r.key for r in _raw(cfg, "partials")}
            if logged - published:
                out["unfinished"] = logged - published
                out["killed_at_ms"] = int(time.time() * 1000)
                os.kill(pid, signal.SIGKILL)
                return
            os.kill(pid, signal.SIGCONT)


def _raw(cfg, name: str):
    from asyncrl.kafka.records import read_records

    return list(read_records(cfg, cfg.kafka.bootstrap_servers, name))


def run_killing_the_worker_mid_partial(cfg) -> tuple[dict, dict]:
    """``asyncrl run``'s job with worker 0 SIGKILLed once a sync leaves it an unfinished
    logged partial; (its summary, what the kill recorded), once the launcher has said it
    restarts the worker."""
    killed: dict = {}
    stop = threading.Event()
    pids: dict[str, int] = {}
    killer = threading.Thread(target=_kill_with_unfinished_partials, args=(cfg, stop, killed, pids))
    killer.start()
    out = io.StringIO()
    try:
        summary = run(cfg, Console(file=out, width=200), on_spawn=pids.__setitem__)
    finally:
        stop.set()
        killer.join(30)
    assert killed, "no sync left an unfinished partial sample to kill the worker over"
    assert "rollout-0 exited with code -9; restarting it" in out.getvalue()
    return summary, killed


def test_killed_worker_recovers_and_every_prompt_is_accounted_once(make_run_cfg, quick_policy):
    cfg = make_run_cfg(*quick_policy, *MODE_D)
    summary, killed = run_killing_the_worker_mid_partial(cfg)
    assert summary["step"] == STEPS and summary["restarts"] == {"rollout-0": 1}

    # The restarted worker (a new incarnation) joined and got the weights.
    events = [r.value for r in read_topic(cfg, "control")]
    incarnations = {e.incarnation for e in events if isinstance(e, ev.WorkerStarted)}
    assert len(incarnations) == 2
    joins = [e for e in events if isinstance(e, ev.WeightsPublished) and len(e.incarnations) == 1]
    assert len({e.incarnations[0] for e in joins}) == 2
    # Its first budget counts the partials it is to continue as stale work.
    first_of = {}
    for e in events:
        if isinstance(e, ev.RolloutResumed):
            first_of.setdefault(e.incarnation, e)
    restarted = first_of[joins[-1].incarnations[0]]
    assert restarted.num_stale >= len(killed["unfinished"])

    # Partials unfinished at the kill were continued by the new incarnation from the logged
    # tokens (the final trajectories extend them), not generated afresh.
    samples = read_topic(cfg, "samples")
    by_id = {r.value.sample_id: r for r in samples}
    partials = {r.value.sample.sample_id: r.value for r in read_topic(cfg, "partials")}
    log_text = (cfg.run_dir / "logs" / "rollout-0.log").read_text()
    assert "from the partials log" in log_text
    ended = [sid for e in events if isinstance(e, ev.SamplesDropped) for sid in e.sample_ids]
    continued = 0
    for sid in killed["unfinished"]:
        if sid not in by_id:
            # Interrupted again at the run's last sync, or its prompt still waits in the group
            # (not committed) when the run ends.
            assert sid in ended or sid not in committed_prompt_ids(cfg)
            continue
        final, cut = by_id[sid], partials[sid]
        assert final.timestamp_ms >= killed["killed_at_ms"]
        for i in cut.interrupted:
            done, prefix = final.value.trajectories[i], cut.sample.trajectories[i]
            n = len(prefix.response_ids)
            assert done.response_ids[:n].tolist() == prefix.response_ids.tolist()
            assert done.response_logprobs[:n].tolist() == prefix.response_logprobs.tolist()
            continued += 1
    assert continued > 0

    # Accounting: every prompt the workers' group has consumed is exactly one sample or one
    # drop logged at the end of the run; nothing is generated twice.
    ids = [r.value.sample_id for r in samples]
    assert [sid for sid, n in Counter(ids).items() if n > 1] == []
    end_drops = [
        sid
        for e in events
        if isinstance(e, ev.SamplesDropped) and e.worker == 0
        for sid in e.sample_ids
    ]
    assert len(end_drops) == len(set(end_drops)) and not set(end_drops) & set(ids)
    taken = committed_prompt_ids(cfg)
    assert taken, "the workers' group committed nothing"
    assert taken <= set(ids) | set(end_drops)
    assert set(ids) | set(end_drops) <= {r.value.sample_id for r in read_topic(cfg, "prompts")}

    # And the audit a user runs after a crash agrees.
    from asyncrl.ops.audit import audit_run

    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    assert report.ok, report.violations
    report_recovery(
        cfg, "worker SIGKILL after a sync logged partials", killed["killed_at_ms"] / 1000
    )


def _finished_on_log(cfg, config: Path, reason: str) -> Path:
    """A run whose control log ends with RunFinished (step 12, ``reason``), its config written
    to ``config``: what a role started again after the end finds."""
    from asyncrl.config import dump_config
    from asyncrl.kafka import Publisher
    from asyncrl.schemas import SCHEMA_HEADER

    done = ev.RunFinished(cfg.run_id, 3, step=12, reason=reason)
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        pub.publish(
            cfg.topic("control"), cfg.run_id, ev.encode_event(done), {SCHEMA_HEADER: done.tag()}
        )
    dump_config(cfg, config)
    return config


def test_a_worker_started_on_a_finished_run_says_so_and_leaves(make_run_cfg, tmp_path, capsys):
    """A second `docker compose up` of one RUN_ID: its workers joined a trainer long gone,
    waited sync.timeout_s (300 s) deaf to SIGTERM and died with a traceback. A run never
    prepared ended in a librdkafka traceback (UNKNOWN_TOPIC_OR_PART)."""
    from asyncrl.cli import main
    from asyncrl.config import dump_config

    cfg = make_run_cfg("sync.timeout_s=60")
    config = _finished_on_log(cfg, tmp_path / "run.yaml", "total_training_steps reached")
    capsys.readouterr()
    t0 = time.monotonic()
    assert main(["rollout", "--worker-id", "0", "--config", str(config)]) == 0
    assert time.monotonic() - t0 < 20
    err = capsys.readouterr().err
    assert f"run {cfg.run_id!r} has finished (total_training_steps reached, step 12)" in err

    never = make_run_cfg(create_topics=False)
    dump_config(never, config)
    assert main(["rollout", "--worker-id", "0", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert never.topic("control") in err and "Traceback" not in err


def test_a_trainer_started_on_a_finished_run_says_so_and_leaves(
    make_run_cfg, quick_policy, tmp_path
):
    """`asyncrl train` started again on a finished run (role by role, a second `docker compose
    up`) resumed from its last checkpoint, trained what was left on the log, published
    TrainerResumed (so the run no longer counted as finished) and waited for workers for
    good, while the workers, seeing it, waited for it."""
    import subprocess
    import sys

    from asyncrl.launch.broker import free_port

    cfg = make_run_cfg(*quick_policy, f"sync.master_port={free_port()}")
    config = _finished_on_log(cfg, tmp_path / "run.yaml", "target accuracy 0.90 reached")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "asyncrl", "train", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the trainer of a finished run was still running after 60 s")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"run {cfg.run_id!r} has finished (target accuracy 0.90 reached, step 12)" in out.stderr
    assert [type(r.value) for r in read_topic(cfg, "control")] == [ev.RunFinished]
