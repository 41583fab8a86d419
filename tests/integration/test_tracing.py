"""Traces across real processes: ``asyncrl run`` with the file exporter, read back and joined.

The trainer and the rollout worker each write their finished spans to
``<run_dir>/traces/<service>.jsonl`` (the JSON-lines exporter, the cross-process stand-in for
an in-memory exporter). The test joins them with what the run's topics say: which samples each
step trained on (``steps``), and the trace context each message carried in its headers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from asyncrl.config import RunConfig, load_config
from asyncrl.kafka import Publisher
from asyncrl.kafka.records import read_records
from asyncrl.telemetry import tracing
from tests.helpers import on_session_broker, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _spans(run_dir: Path) -> dict[str, list[dict]]:
    return {
        f.stem: [json.loads(line) for line in f.open()]
        for f in sorted((run_dir / "traces").glob("*.jsonl"))
    }


def _span_id(headers: dict[str, bytes]) -> str:
    """The parent span id in a W3C traceparent header: 00-<trace>-<span>-<flags>."""
    return "0x" + headers["traceparent"].decode().split("-")[2]


def _traced_run(
    broker: str, tmp_path: Path, quick_policy: tuple[str, ...], *settings: str
) -> tuple[RunConfig, subprocess.CompletedProcess[str]]:
    """``asyncrl run`` as a user starts it, traced, with ``settings`` (the exporter, the
    mode, the steps) on the session's broker; returns its config and finished process."""
    overrides = [
        *quick_policy,
        f"run_id=t{uuid.uuid4().hex[:8]}",
        f"output_dir='{tmp_path}'",
        *on_session_broker(broker),
        "tracing.enabled=true",
        "trainer.test_freq=0",
        "trainer.target_accuracy=null",
        *settings,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl", "run", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load_config(overrides=overrides), proc


def test_a_step_links_exactly_the_samples_it_trained_on(broker, tmp_path, quick_policy):
    cfg, _ = _traced_run(
        broker,
        tmp_path,
        quick_policy,
        "tracing.exporter=file",
        "actor_rollout_ref.rollout.name=sim",
        "sim.long_tail_fraction=0.5",  # long responses in flight at every sync: partials
        "data.max_response_length=128",
        "actor_rollout_ref.rollout.n=4",
        "async_training.staleness_threshold=0.5",
        "async_training.partial_rollout=true",
        "trainer.total_training_steps=5",
    )
    spans = _spans(cfg.run_dir)
    assert set(spans) == {"asyncrl-launcher", "asyncrl-rollout-0", "asyncrl-trainer"}
    trainer, rollout = spans["asyncrl-trainer"], spans["asyncrl-rollout-0"]

    # Every message the run produced carries its trace context in its headers.
    samples = read_topic(cfg, "samples")
    partials = read_topic(cfg, "partials")
    control = read_topic(cfg, "control")
    assert partials, "the workload was meant to interrupt samples"
    for rec in [*samples, *partials, *control]:
        assert "traceparent" in rec.headers, (rec.topic, rec.offset)

    # The header names the rollout's send span of that very message.
    send_spans = {
        s["context"]["span_id"]: s for s in rollout if s["name"] == f"send {cfg.topic('samples')}"
    }
    sample_span = {r.key: _span_id(r.headers) for r in samples}
    for key, span_id in sample_span.items():
        send = send_spans[span_id]
        assert send["kind"] == "SpanKind.PRODUCER"
        assert send["attributes"]["messaging.system"] == "kafka"
        assert send["attributes"]["messaging.destination.name"] == cfg.topic("samples")
        assert send["attributes"]["messaging.kafka.message.key"] == key
        assert "messaging.kafka.offset" in send["attributes"]

    # Each train.step links to exactly the send spans of the samples its step record lists.
    steps = {r.value.step: r.value for r in read_topic(cfg, "steps")}
    step_spans = {s["attributes"]["asyncrl.step"]: s for s in trainer if s["name"] == "train.step"}
    assert sorted(step_spans) == sorted(steps) == [1, 2, 3, 4, 5]
    for n, span in step_spans.items():
        linked = sorted(link["context"]["span_id"] for link in span["links"])
        assert linked == sorted(sample_span[sid] for sid in steps[n].sample_ids)
        assert span["attributes"]["messaging.batch.message_count"] == len(steps[n].sample_ids)
        assert span["attributes"]["asyncrl.version"] == steps[n].version

    # From a sample's own trace, the step that trained it: the trainer's "process" span, a
    # child of the sample's send span, names the step and links to its train.step span.
    marks = {
        s["parent_id"]: s
        for s in trainer
        if s["name"] == f"process {cfg.topic('samples')}" and s["kind"] == "SpanKind.CONSUMER"
    }
    for n, step in steps.items():
        for sid in step.sample_ids:
            mark = marks[sample_span[sid]]
            assert (
                mark["context"]["trace_id"] == send_spans[sample_span[sid]]["context"]["trace_id"]
            )
            assert mark["attributes"]["asyncrl.step"] == n
            assert mark["attributes"]["messaging.kafka.message.key"] == sid
            (link,) = mark["links"]
            assert link["context"]["span_id"] == step_spans[n]["context"]["span_id"]

    # A sample's rollout spans form one tree under its process span: generate segments (more
    # than one for a sample continued after a sync), rewards, the send.
    by_parent = defaultdict(list)
    for s in rollout:
        by_parent[s["parent_id"]].append(s)
    roots = {
        s["attributes"]["asyncrl.sample_id"]: s for s in rollout if s["name"].startswith("process ")
    }
    interrupted = {r.key for r in partials}
    for sid in sample_span:
        children = Counter(c["name"] for c in by_parent[roots[sid]["context"]["span_id"]])
        assert children["reward"] == cfg.actor_rollout_ref.rollout.n
        assert children[f"send {cfg.topic('samples')}"] == 1
        assert children["generate"] >= 1 + (sid in interrupted)

    # A sync is one trace across processes: the trainer's weight_sync, pause and transfer,
    # and the worker's pause and load, the trainer's span linked to the step that triggered it.
    syncs = [s for s in trainer if s["name"] == "weight_sync"]
    assert len(syncs) == 4  # after steps 1-4; none after the last
    step_ids = {s["context"]["span_id"] for s in step_spans.values()}
    for sync in syncs:
        assert sync["links"][0]["context"]["span_id"] in step_ids
        names = Counter(
            (s["resource"]["attributes"]["service.name"], s["name"])
            for s in trainer + rollout
            if s["context"]["trace_id"] == sync["context"]["trace_id"]
        )
        for who, what in [
            ("asyncrl-trainer", "sync.pause"),
            ("asyncrl-trainer", "sync.transfer"),
            ("asyncrl-rollout-0", "sync.pause"),
            ("asyncrl-rollout-0", "weights.load"),
        ]:
            assert names[(who, what)] == 1, (who, what, names)


def test_tracing_is_off_by_default(run_cfg):
    """No provider, no headers: a run without tracing sends what it always sent."""
    assert not tracing.enabled_by(run_cfg)
    assert not tracing.active()
    with Publisher(run_cfg.kafka, run_cfg.kafka.bootstrap_servers) as pub:
        pub.publish(run_cfg.topic("control"), "k", b"x", headers={"asyncrl-schema": "x"})
    (rec,) = read_records(run_cfg, run_cfg.kafka.bootstrap_servers, "control")
    assert set(rec.headers) == {"asyncrl-schema"}


def test_otel_traces_exporter_turns_it_on(run_cfg, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert tracing.enabled_by(run_cfg)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not tracing.enabled_by(run_cfg)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.enabled_by(run_cfg)


def test_console_spans_go_to_each_process_log_not_the_terminal(broker, tmp_path, quick_policy):
    """``tracing.exporter=console``: the launcher's spans (one per prompt fed) went to its
    stdout, 9,500 lines of JSON in front of the live progress; they go to logs/launcher.log,
    the roles' to their own logs, as the roles' always did."""
    cfg, proc = _traced_run(
        broker,
        tmp_path,
        quick_policy,
        "tracing.exporter=console",
        "trainer.total_training_steps=2",
    )
    assert '"trace_id"' not in proc.stdout + proc.stderr
    logs = cfg.run_dir / "logs"
    launcher = (logs / "launcher.log").read_text()
    assert f'"name": "send {cfg.topic("prompts")}"' in launcher
    assert '"service.name": "asyncrl-launcher"' in launcher
    assert '"name": "train.step"' in (logs / "trainer.log").read_text()
    assert f'"name": "send {cfg.topic("samples")}"' in (logs / "rollout-0.log").read_text()


def test_an_in_flight_sync_is_one_trace_with_the_workers_load(broker, tmp_path, quick_policy):
    """``in_flight_update=true``: the worker swaps weights between two tokens, with no pause.
    Its part of the sync was missing from the sync's trace (its RolloutPaused and
    WeightsLoaded went out as roots of their own); it is the trainer's child, as in (c)/(d)."""
    cfg, _ = _traced_run(
        broker,
        tmp_path,
        quick_policy,
        "tracing.exporter=file",
        "actor_rollout_ref.rollout.name=sim",
        "async_training.staleness_threshold=0.5",
        "async_training.partial_rollout=true",
        "async_training.in_flight_update=true",
        "trainer.total_training_steps=4",
    )
    spans = _spans(cfg.run_dir)
    trainer, rollout = spans["asyncrl-trainer"], spans["asyncrl-rollout-0"]
    by_id = {s["context"]["span_id"]: s for s in trainer + rollout}
    syncs = [s for s in trainer if s["name"] == "weight_sync"]
    assert len(syncs) == 3  # after steps 1-3
    for sync in syncs:
        (load,) = [
            s
            for s in rollout
            if s["name"] == "weights.load"
            and s["context"]["trace_id"] == sync["context"]["trace_id"]
        ]
        assert load["attributes"]["asyncrl.version"] == sync["attributes"]["asyncrl.version"]
        assert by_id[load["parent_id"]]["name"] == f"send {cfg.topic('control')}"  # SyncRequested
        sends = [s for s in rollout if s["parent_id"] == load["context"]["span_id"]]
        assert len(sends) == 2  # RolloutPaused and WeightsLoaded
