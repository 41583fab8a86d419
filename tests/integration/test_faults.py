"""Fault scenarios on real processes and a real broker: a process dies, the run goes on, and
the log stays exact (each sample trained once, versions never reused, every prompt taken
accounted for)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from rich.console import Console

from asyncrl.kafka import Reader
from asyncrl.launch.launcher import run
from asyncrl.schemas import control as ev
from asyncrl.schemas.step import decode_step
from tests.helpers import (
    SMALL,
    check_log_invariants,
    parity_reward,
    read_topic,
    report_recovery,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _wait_for_step(cfg, at_step: int) -> bool:
    """Until the run's steps topic shows step ``at_step`` (False: not within 240 s)."""
    deadline = time.monotonic() + 240
    while not (cfg.run_dir / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    with Reader(cfg.kafka, cfg.kafka.bootstrap_servers, decode_step) as steps:
        steps.assign(cfg.topic("steps"))
        while time.monotonic() < deadline:
            if any(r.value.step >= at_step for r in steps.poll(0.1)):
                return True
    return False


def _kill_when(cfg, pids: dict[str, int], name: str, at_step: int, out: dict) -> None:
    """SIGKILL process ``name`` once the steps topic shows step ``at_step``."""
    if _wait_for_step(cfg, at_step):
        out["killed_pid"] = pids[name]
        out["killed_at"] = time.time()
        os.kill(pids[name], signal.SIGKILL)


@contextlib.contextmanager
def _fault_beside(cfg, fault, *args, join_s: float = 30) -> Iterator[tuple[dict, dict]]:
    """``fault(cfg, pids, *args, record)`` on a thread beside the block, which runs the run;
    yields (the pids the launcher is to tell of the processes it spawns, the dict the fault
    records in)."""
    pids: dict[str, int] = {}
    record: dict = {}
    thread = threading.Thread(target=fault, args=(cfg, pids, *args, record))
    thread.start()
    try:
        yield pids, record
    finally:
        thread.join(join_s)


def _run_with_fault(cfg, fault, *args, join_s: float = 30) -> tuple[dict, dict, str]:
    """``asyncrl run``'s job with a fault beside it (``_fault_beside``); (the summary, the
    fault's record, what the launcher printed)."""
    out = io.StringIO()
    with _fault_beside(cfg, fault, *args, join_s=join_s) as (pids, record):
        summary = run(cfg, Console(file=out, width=200), on_spawn=pids.__setitem__)
    return summary, record, out.getvalue()


def _run_killing_the_trainer(cfg, at_step: int) -> tuple[dict, float]:
    """``asyncrl run``'s job with the trainer SIGKILLed at ``at_step``; (the summary, when it
    was killed), once ``asyncrl run`` has said it restarts it."""
    summary, killed, out = _run_with_fault(cfg, _kill_when, "trainer", at_step)
    assert killed, "the trainer was never killed"
    assert "trainer exited with code -9; restarting it" in out
    assert re.search(r"trainer pid \d+, rollout-0 pid \d+; their logs: ", out)  # which is which
    assert re.search(r"restarting it \(1/\d+, pid \d+\)", out)
    assert "run summary (since the trainer's last start" in out
    return summary, killed["killed_at"]


SYNCS = {
    "paused": [],  # mode (c): the hand-shake with pauses
    # The worker receives on a thread: the killed trainer's pair fails there, mid-generation.
    "in_flight": ["async_training.partial_rollout=true", "async_training.in_flight_update=true"],
}


@pytest.mark.parametrize("sync", sorted(SYNCS))
def test_a_killed_trainer_is_restarted_and_resumes_from_its_checkpoint(
    make_run_cfg, quick_policy, sync
):
    steps = 10
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=3",
        "async_training.staleness_threshold=0.5",
        *SYNCS[sync],
    )
    summary, killed_at = _run_killing_the_trainer(cfg, at_step=5)
    assert summary["step"] == steps
    assert summary["restarts"] == {"trainer": 1}  # its own summary counts from its restart

    events = [r.value for r in read_topic(cfg, "control")]
    resumed = [e for e in events if isinstance(e, ev.TrainerResumed)]
    assert len(resumed) == 1 and resumed[0].step in (3, 6)
    # The worker survived the trainer's death and joined the new one (same incarnation).
    starts = {e.incarnation for e in events if isinstance(e, ev.WorkerStarted)}
    assert len(starts) == 1
    log_text = (cfg.run_dir / "logs" / "rollout-0.log").read_text()
    assert "joining the new trainer" in log_text
    info = check_log_invariants(cfg)
    assert info["trainer_restarts"] == 1 and info["run_finished"] == 1
    report_recovery(cfg, "trainer SIGKILL", killed_at)


def test_a_trainer_killed_between_syncs_never_gives_a_version_two_sets_of_weights(
    make_run_cfg, quick_policy
):
    """The demo's cadence (a sync every 4 steps, groups of 8, an evaluation every 5 steps):
    the restarted trainer trains on the samples already logged before the worker rejoins it,
    so the worker joins after an update. Sending it those weights under the resumed version
    gave that version two checksums (audit: reused_versions); it now gets a new version."""
    cfg = make_run_cfg(
        *quick_policy,
        "trainer.total_training_steps=20",
        "trainer.save_freq=3",
        "trainer.test_freq=5",
        "async_training.trigger_parameter_sync_step=4",
    )
    summary, killed_at = _run_killing_the_trainer(cfg, at_step=7)
    assert summary["step"] == 20
    info = check_log_invariants(cfg)  # reused_versions among them
    assert info["trainer_restarts"] == 1
    report_recovery(cfg, "trainer SIGKILL between syncs (a sync every 4 steps)", killed_at)


def test_a_killed_worker_of_a_dynamic_sampling_run_counts_its_filtered_groups_from_the_log(
    make_run_cfg, quick_policy, tmp_path
):
    """With dynamic sampling a worker takes a filtered group's slot back as it publishes it,
    and the trainer does not count the group as consumed; a restarted worker must leave its
    previous incarnation's filtered groups out of its stale count too (it finds them on the
    log by their header), or at staleness 0 it opens its versions with no budget and the run
    waits for samples that never come."""
    from asyncrl.schemas.sample import NO_SIGNAL_HEADER

    steps = 8
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "algorithm.filter_groups.enable=true",
        "async_training.staleness_threshold=0",
        "sync.timeout_s=60",
        parity_reward(tmp_path),
    )
    summary, killed, _ = _run_with_fault(cfg, _kill_when, "rollout-0", 3)
    assert killed, "the worker was never killed"
    assert summary["step"] == steps and summary["restarts"] == {"rollout-0": 1}

    before = [r for r in read_topic(cfg, "samples") if r.timestamp_ms < killed["killed_at"] * 1000]
    assert any(NO_SIGNAL_HEADER in r.headers for r in before), "no group filtered before"
    info = check_log_invariants(cfg)  # the refills within budget, each sample trained once
    assert info["worker_incarnations"] == 2 and info["run_finished"] == 1
    report_recovery(cfg, "worker SIGKILL, dynamic sampling", killed["killed_at"])


def _kill_broker_at(cfg, pids: dict[str, int], at_step: int, out: dict) -> None:
    """SIGKILL the embedded broker once metrics.jsonl shows step ``at_step``."""
    metrics = cfg.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        text = metrics.read_text() if metrics.exists() else ""
        if f'"step": {at_step},' in text:
            out["killed"] = pids["broker"]
            out["killed_at"] = time.time()
            os.kill(pids["broker"], signal.SIGKILL)
            return
        time.sleep(0.05)


def test_a_killed_embedded_broker_loses_nothing_and_the_run_resumes(
    make_run_cfg, quick_policy, capsys
):
    from asyncrl.launch.log_archive import offline_broker
    from asyncrl.launch.supervise import BrokerDied

    steps = 8
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=2",
        "async_training.staleness_threshold=0.5",
        create_topics=False,
    )
    cfg.kafka.bootstrap_servers = None  # the embedded default, as `make run` uses it
    out = io.StringIO()
    with (
        _fault_beside(cfg, _kill_broker_at, 3) as (pids, killed),
        pytest.raises(BrokerDied, match="run the same command again"),
    ):
        run(cfg, Console(file=out, width=200), on_spawn=pids.__setitem__)
    assert killed
    summary = run(cfg, Console(file=out, width=200))  # the same command again
    assert summary["step"] == steps
    assert "holds an unfinished run: restoring its log" in out.getvalue()

    with offline_broker(cfg) as bootstrap:  # the log outlives both brokers
        cfg.kafka.bootstrap_servers = bootstrap
        events = [r.value for r in read_topic(cfg, "control")]
        assert len([e for e in events if isinstance(e, ev.TrainerResumed)]) == 1
        assert len([e for e in events if isinstance(e, ev.RunFinished)]) == 1
        info = check_log_invariants(cfg)
        report_recovery(cfg, "embedded broker SIGKILL, same command again", killed["killed_at"])

    # What a user runs afterwards, with no broker up: the CLI reads the archived log.
    from asyncrl.cli import main

    capsys.readouterr()
    where = [f"run_id={cfg.run_id}", f"output_dir={cfg.output_dir}"]
    assert main(["inspect", "samples", "--json", *where]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(shown) == info["samples"]
    assert main(["audit", cfg.run_id, "--output-dir", str(cfg.output_dir)]) == 0


def _kill_asyncrl_run_at(cfg, config, step: int) -> float:
    """``asyncrl run --config CONFIG`` as a process, SIGKILLed once metrics.jsonl shows
    ``step``; when it was killed."""
    import subprocess

    command = [sys.executable, "-m", "asyncrl", "run", "--config", str(config)]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        metrics = cfg.run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and launcher.poll() is None:
            if metrics.exists() and f'"step": {step},' in metrics.read_text():
                break
            time.sleep(0.02)
        assert launcher.poll() is None, "the run ended before it could be killed"
        launcher.kill()
        return time.time()
    finally:
        launcher.wait(30)


def test_a_sigkilled_asyncrl_run_leaves_an_archive_that_audits_clean(make_run_cfg, quick_policy):
    """`asyncrl run` SIGKILLed (its archiver with it, no clean close): the archive must still
    be a log some run wrote. Its files were flushed only every second, so a large sample past
    the write buffer reached the disk while the small control records before it did not:
    `asyncrl audit` then found samples of a version whose budget was never opened."""

    from asyncrl.cli import main
    from asyncrl.config import dump_config

    steps = 30
    cfg = make_run_cfg(
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=5",
        "trainer.test_freq=0",
        create_topics=False,
    )
    cfg.kafka.bootstrap_servers = None  # the embedded broker, archived by the launcher
    config = cfg.run_dir.parent / f"{cfg.run_id}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, config)
    _kill_asyncrl_run_at(cfg, config, step=12)  # broker, trainer and workers die with it
    time.sleep(1)
    where = ["--output-dir", str(cfg.output_dir)]
    assert main(["audit", cfg.run_id, *where]) == 0  # the archive as the kill left it

    summary = run(cfg, Console(file=io.StringIO(), width=200))  # the same command again
    assert summary["step"] == steps
    assert main(["audit", cfg.run_id, *where]) == 0


def test_asyncrl_run_stopped_checkpoints_its_last_step_and_resumes_without_training_twice(
    make_run_cfg, quick_policy
):
    """Ctrl-C at the terminal (SIGINT to the whole group), then ``kill PID`` (SIGTERM to the
    launcher alone) of the same command run again. The launcher SIGKILLed its trainer at once
    (SIGTERM: it died itself), cutting the trainer's own orderly stop short: the next launch
    trained every step since the last ``save_freq`` checkpoint again (6 void steps of 16
    seen). Now the trainer ends its step and checkpoints it, and the launcher exits 130 or
    143. Both stops are in one run, one after the other (each was a run of its own, resumed
    to its end: the same resume twice): the second also stops a launch that resumed."""
    from asyncrl.config import dump_config
    from asyncrl.consumers.checkpoint import latest_checkpoint
    from asyncrl.launch.log_archive import offline_broker

    # Stopped at step 6, then 3 steps after the resume (~0.15 s a step; each stop lands
    # within one): 10 to spare.
    steps = 20
    cfg = make_run_cfg(
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=100",  # only the stops' checkpoints
        "trainer.test_freq=0",
        create_topics=False,
    )
    cfg.kafka.bootstrap_servers = None  # the embedded broker, as `make run` uses it
    config = cfg.run_dir.parent / f"{cfg.run_id}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, config)
    at_step = 6
    for how, code in (("ctrl-c", 130), ("sigterm", 143)):
        returncode, out = _stop_asyncrl_run_at(config, cfg, at_step, how)
        assert returncode == code, (how, out[-3000:])
        assert "Traceback" not in out, (how, out[-3000:])
        latest = latest_checkpoint(cfg.run_dir)
        assert latest is not None, f"no checkpoint was written on the stop ({how})"
        stopped_at = int(latest.name.removeprefix("step_"))
        assert stopped_at >= at_step and f"resume the run from step {stopped_at}" in out, how
        at_step = stopped_at + 3

    summary = run(cfg, Console(file=io.StringIO(), width=200))  # the same command again
    assert summary["step"] == steps
    with offline_broker(cfg) as bootstrap:  # the run's archived log
        cfg.kafka.bootstrap_servers = bootstrap
        info = check_log_invariants(cfg)
    assert info["steps_void"] == 0  # no step trained twice


def _stop_asyncrl_run_at(config, cfg, step: int, how: str) -> tuple[int, str]:
    """``asyncrl run --config CONFIG`` as a terminal's foreground job, stopped once
    metrics.jsonl shows ``step``: Ctrl-C (``how="ctrl-c"``: SIGINT to its process group) or
    ``kill PID`` (SIGTERM to the launcher alone); (its exit code, what it printed)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
        env={**os.environ, "COLUMNS": "300"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert _wait_for_step_in_metrics(cfg, step, launcher), f"the run never reached {step}"
        if how == "ctrl-c":
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            os.kill(launcher.pid, signal.SIGTERM)
        out, _ = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    return launcher.returncode, out


def _wait_for_step_in_metrics(cfg, step: int, proc) -> bool:
    metrics = cfg.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and f'"step": {step},' in metrics.read_text():
            return True
        time.sleep(0.02)
    return False


def _bad_records(topic_name: str) -> list[tuple[bytes, dict[str, str]]]:
    """Garbage, a truncated record and a wrongly tagged one, for ``topic_name``."""
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.prompt import TAG as PROMPT_TAG
    from asyncrl.schemas.prompt import PromptRecord, encode_prompt
    from asyncrl.schemas.sample import TAG as SAMPLE_TAG

    valid = encode_prompt(PromptRecord("add-9-9", "09+09=", "18", 0))
    tag = {"prompts": PROMPT_TAG, "samples": SAMPLE_TAG}.get(topic_name, "control.RunFinished/3")
    return [
        (b"\x00garbage", {SCHEMA_HEADER: tag}),
        (valid[: len(valid) // 2], {SCHEMA_HEADER: tag}),
        (valid, {SCHEMA_HEADER: "sample/3" if topic_name == "prompts" else tag}),
    ]


def _inject_at(cfg, at_step: int, out: dict) -> None:
    from asyncrl.kafka import Publisher

    deadline = time.monotonic() + 240
    metrics = cfg.run_dir / "metrics.jsonl"
    # Connected first: a producer's start-up on Tansu takes 0.5-1 s, a step ~0.1 s.
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        while time.monotonic() < deadline:
            if metrics.exists() and f'"step": {at_step},' in metrics.read_text():
                break
            time.sleep(0.02)
        for name in ("control", "partials", "steps", "dead-letter"):
            for i, (value, headers) in enumerate(_bad_records(name)):
                pub.publish(cfg.topic(name), f"bad-{name}-{i}", value, headers)
                out.setdefault(name, 0)
                out[name] += 1


def test_bad_records_on_every_topic_are_dead_lettered_once_and_the_run_goes_on(
    make_run_cfg, quick_policy
):
    from asyncrl.kafka import HEADER_SOURCE_TOPIC

    steps = 20  # long enough to read the control records injected after step 1
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "async_training.staleness_threshold=0.5",
        "async_training.partial_rollout=true",
        "kafka.topics.partitions.prompts=1",  # the bad prompts come first, before any good one
    )
    from asyncrl.kafka import Publisher

    injected: dict = {}
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:  # read first by the workers
        for name in ("prompts", "samples"):
            for i, (value, headers) in enumerate(_bad_records(name)):
                pub.publish(cfg.topic(name), f"bad-{name}-{i}", value, headers)
    # Control is read from where each process starts: those go in while the run goes.
    injector = threading.Thread(target=_inject_at, args=(cfg, 1, injected))
    injector.start()
    out = io.StringIO()
    try:
        summary = run(cfg, Console(file=out, width=200))
    finally:
        injector.join(30)
    assert injected and summary["step"] == steps
    assert "restarting" not in out.getvalue()  # no process died over a bad record

    dead = read_topic(cfg, "dead-letter")
    copies = Counter(r.key for r in dead if r.key.startswith("bad-"))
    # Read by consumers that own them: each bad prompt, sample and control record once.
    expected = {f"bad-{t}-{i}" for t in ("prompts", "samples", "control") for i in range(3)}
    assert set(copies) >= expected and all(copies[k] == 1 for k in expected), copies
    sources = {r.key: r.headers[HEADER_SOURCE_TOPIC].decode() for r in dead if r.key in expected}
    assert sources["bad-control-2"] == cfg.topic("control")
    check_log_invariants(cfg)


def test_asyncrl_run_killed_and_started_again_resumes_without_doubling_anything(
    make_run_cfg, quick_policy, tmp_path
):

    from asyncrl.config import dump_config

    steps = 8
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=2",
        "async_training.staleness_threshold=0.5",
    )
    config = tmp_path / "run.yaml"
    dump_config(cfg, config)
    killed_at = _kill_asyncrl_run_at(cfg, config, step=3)  # with it, trainer and workers
    fed_before = len(read_topic(cfg, "prompts"))

    out = io.StringIO()
    summary = run(cfg, Console(file=out, width=200))  # the same run id, started again
    assert summary["step"] == steps
    assert "fed 0 prompts" in out.getvalue() and "were there already" in out.getvalue()
    # the first launch's steps move the bar without being printed again as this launch's
    assert out.getvalue().count("resumed: steps 1-") == 1, out.getvalue()
    assert "run summary (since the trainer's last start" in out.getvalue()
    assert len(read_topic(cfg, "prompts")) == fed_before  # no prompt fed twice
    events = [r.value for r in read_topic(cfg, "control")]
    assert len([e for e in events if isinstance(e, ev.TrainerResumed)]) == 1
    check_log_invariants(cfg)
    report_recovery(cfg, "asyncrl run SIGKILL, same command again", killed_at)


def _stall_broker_at(cfg, pids: dict[str, int], at_step: int, stall_s: float, out: dict) -> None:
    """SIGSTOP the embedded broker for ``stall_s`` once metrics.jsonl shows ``at_step``."""
    metrics = cfg.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if metrics.exists() and f'"step": {at_step},' in metrics.read_text():
            os.kill(pids["broker"], signal.SIGSTOP)
            out["stopped_at"] = time.time()
            time.sleep(stall_s)
            os.kill(pids["broker"], signal.SIGCONT)
            out["resumed_at"] = time.time()
            return
        time.sleep(0.05)


@pytest.mark.heavy  # `make test-heavy`; in `make test`: a client stalled by a SIGSTOPped broker
# (test_kafka_faults.py) and a whole run over a killed broker (above)
def test_a_broker_stalled_for_15_s_costs_time_not_work(make_run_cfg, quick_policy):
    from asyncrl.launch.log_archive import offline_broker

    steps = 8
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "async_training.staleness_threshold=0.5",
        "async_training.partial_rollout=true",
        create_topics=False,
    )
    cfg.kafka.bootstrap_servers = None  # the launcher's own broker, so the test may stop it
    summary, stalled, out = _run_with_fault(cfg, _stall_broker_at, 2, 15.0, join_s=60)
    assert stalled.get("resumed_at"), "the broker was never stalled"
    assert summary["step"] == steps
    assert "restarting" not in out  # nobody died of the stall
    with offline_broker(cfg) as bootstrap:
        cfg.kafka.bootstrap_servers = bootstrap
        check_log_invariants(cfg)
        report_recovery(cfg, "broker SIGSTOP 15 s (from SIGCONT)", stalled["resumed_at"])


def _stop_worker_at(cfg, pids: dict[str, int], at_step: int, stop_s: float, out: dict) -> None:
    """SIGSTOP rollout worker 0 for ``stop_s`` once the steps topic shows ``at_step``."""
    if _wait_for_step(cfg, at_step):
        os.kill(pids["rollout-0"], signal.SIGSTOP)
        out["stopped_at"] = time.time()
        time.sleep(stop_s)
        os.kill(pids["rollout-0"], signal.SIGCONT)
        out["resumed_at"] = time.time()


STOPS = {
    # kafka.session_timeout_ms, heartbeat_interval_ms, max_poll_interval_ms; the stop (s)
    # Opt-in (`make test-heavy`): the same fault as standalone_defaults' at shorter timeouts.
    "short_session": (1500, 200, 2000, 5.0),
    # What a run pointed at a standalone broker (`asyncrl broker`, a Kafka cluster) gets by
    # default: where the fault was reported (4 runs of 4), the stop past max.poll.interval.
    "standalone_defaults": (6000, 500, 7000, 10.0),
}


@pytest.mark.parametrize(
    "timeouts",
    [pytest.param("short_session", marks=pytest.mark.heavy), "standalone_defaults"],
)
def test_a_worker_stopped_past_its_session_timeout_costs_time_not_the_run(
    make_run_cfg, quick_policy, timeouts
):
    """A rollout worker stopped (SIGSTOP: a debugger, a stalled VM) for longer than its group
    session and max.poll.interval, beside a healthy one, on a standalone broker. Before, the
    run never trained again: the stopped worker got its prompt partitions back still paused
    by librdkafka and never resumed them (4 runs of 4 with one worker), and the healthy one,
    waiting in the sync for the stopped one's pause without polling its prompts group, left
    the group too (both leaving at once could wedge it on Tansu: at the standalone defaults
    neither worker owned a prompt partition again)."""
    session_ms, heartbeat_ms, max_poll_ms, stop_s = STOPS[timeouts]
    steps = 12
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "actor_rollout_ref.rollout.num_workers=2",
        f"kafka.session_timeout_ms={session_ms}",
        f"kafka.heartbeat_interval_ms={heartbeat_ms}",
        f"kafka.max_poll_interval_ms={max_poll_ms}",
        "sync.timeout_s=60",  # before the fix: a trainer waiting for samples until this
    )
    summary, stopped, out = _run_with_fault(cfg, _stop_worker_at, 3, stop_s, join_s=60)
    assert stopped.get("resumed_at"), "the worker was never stopped"
    assert summary["step"] == steps
    assert "restarting" not in out  # nobody died of the stop
    healthy = (cfg.run_dir / "logs" / "rollout-1.log").read_text()
    assert "not polled within kafka.max_poll_interval_ms" not in healthy
    check_log_invariants(cfg)
    report_recovery(
        cfg,
        f"worker SIGSTOP {stop_s:.0f} s, past its session of {session_ms} ms (from SIGCONT)",
        stopped["resumed_at"],
    )


def _terminate_when(cfg, pids: dict[str, int], name: str, at_step: int, out: dict) -> None:
    """SIGTERM process ``name`` (``kill PID``) once the steps topic shows ``at_step``."""
    if _wait_for_step(cfg, at_step):
        out["stopped_at"] = time.time()
        os.kill(pids[name], signal.SIGTERM)


def test_a_run_whose_last_worker_is_told_to_stop_says_so_and_fails_once(make_run_cfg, quick_policy):
    """``kill -TERM`` of a worker removes it from the run (docs/cluster.md); it exits 143. It
    exited 0, which says the run finished, so with the last worker gone nothing said why the
    trainer then waited for samples for sync.timeout_s, and it was restarted to wait again,
    ``trainer.max_restarts`` times (20 minutes by default) before the run failed."""
    from asyncrl.launch.launcher import RunFailed

    # The run fails sync.timeout_s after the stop: the trainer's wait for the next step's
    # samples. 5 s is also the bound on the first step's (~1.5 s here: worker start and join).
    cfg = make_run_cfg(*SMALL, *quick_policy, "trainer.total_training_steps=40", "sync.timeout_s=5")
    out = io.StringIO()
    with (
        _fault_beside(cfg, _terminate_when, "rollout-0", 3) as (pids, stopped),
        pytest.raises(RunFailed, match="no rollout worker is left to generate"),
    ):
        run(cfg, Console(file=out, width=300), on_spawn=pids.__setitem__)
    assert stopped, "the worker was never stopped"
    said = out.getvalue()
    assert "rollout-0 was stopped (SIGTERM) and left the run; not restarted" in said
    assert "No rollout worker is left" in said and "--worker-id 0" in said
    assert "restarting" not in said
    worker_log = (cfg.run_dir / "logs" / "rollout-0.log").read_text()
    assert "stopped (SIGTERM) with the run still open" in worker_log
    check_log_invariants(cfg)


def _start_a_second_worker_0(cfg, pids: dict[str, int], at_step: int, out: dict) -> None:
    """At ``at_step``, a user starts ``asyncrl rollout --worker-id 0`` beside the run's own
    worker 0 (a copy-pasted command, a compose service scaled with a fixed id)."""
    if not _wait_for_step(cfg, at_step):
        return
    log_path = cfg.run_dir / "logs" / "second-worker-0.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncrl", "rollout", "--worker-id", "0"]
            + ["--config", str(cfg.run_dir / "config.yaml")],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    out["proc"], out["log"] = proc, log_path
    try:
        out["rc"] = proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out["rc"] = "still running at the end"


def test_a_second_process_started_as_the_same_worker_takes_its_place_and_says_so(
    make_run_cfg, quick_policy
):
    """Two processes with one --worker-id: the newer one takes the id over (the trainer
    replaces a worker's incarnation by the newest, as it does a restarted worker's) and the
    older one stops with an error naming the clash. Before, the older one ran on, cut off
    from the weights and silent. Here ``asyncrl run`` then restarts its own worker 0, which
    in turn displaces the stray one: one worker 0 runs at a time, and the log stays exact."""
    # ~0.3 s each, idle: the stray worker's start (~7 s), worker 0 displaced, restarted, and
    # the stray one displaced in turn (~4 s) are over by step ~26; 60 leaves twice that.
    steps = 60
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        f"trainer.total_training_steps={steps}",
        "async_training.staleness_threshold=0.5",
        "actor_rollout_ref.rollout.emulated_decode_latency_s=0.05",
        "sync.timeout_s=60",
    )
    summary, second, out = _run_with_fault(cfg, _start_a_second_worker_0, 2, join_s=120)
    assert "proc" in second, "the second worker was never started"
    assert summary["step"] == steps
    clash = "another process started as worker 0"
    first = (cfg.run_dir / "logs" / "rollout-0.log").read_text()
    assert clash in first, first[-3000:]
    assert "rollout-0 exited with code 1; restarting it" in out
    stray = second["log"].read_text()
    assert second["rc"] == 1 and clash in stray, stray[-3000:]
    assert "Traceback" not in stray
    events = [r.value for r in read_topic(cfg, "control")]
    stopped = [e.reason for e in events if isinstance(e, ev.WorkerStopped)]
    assert stopped.count("displaced") == 2, stopped
    check_log_invariants(cfg)


def test_a_trainer_past_max_num_gen_batches_fails_the_run_once_not_restarted(
    make_run_cfg, quick_policy, tmp_path
):
    """docs/tuning.md: max_num_gen_batches turns too many filtered groups into an error, as in
    DAPO. The trainer raised it, exited 1 and was restarted as after a crash (up to
    trainer.max_restarts times); the restarted trainer could then finish the run as if the
    limit held. Found by a tuning walkthrough: the trainer exits 3 (it gave up) and the
    launcher fails the run with its reason, without a restart."""
    from asyncrl.launch.launcher import RunFailed

    zero = tmp_path / "zero_reward.py"
    zero.write_text(
        "def compute_score(data_source, solution_str, ground_truth, **kw):\n    return 0.0\n"
    )
    cfg = make_run_cfg(
        *SMALL,
        *quick_policy,
        "trainer.total_training_steps=4",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=1",
        f"custom_reward_function.path={zero}",
    )
    out = io.StringIO()
    with pytest.raises(RunFailed) as failed:
        run(cfg, Console(file=out, width=300))
    said = str(failed.value)
    assert said.startswith("the trainer gave up (a limit the config sets, not a crash")
    assert "trainer exited with code 3" in said
    assert re.search(
        r"max_num_gen_batches=1: step 1 read \d+ samples, filtered \d+ .* kept 0 of 4", said
    )
    assert "restarting" not in out.getvalue()
