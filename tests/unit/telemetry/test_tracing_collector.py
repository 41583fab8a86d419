"""Tracing to an OTLP collector that is not there turns itself off with one warning: a
10-second demo run took 74 s, its exporters retrying localhost:4318 at each process's end."""

from __future__ import annotations

import logging
import socket

import pytest

from asyncrl.config import load_config
from asyncrl.telemetry import tracing


@pytest.fixture
def cfg():
    return load_config(overrides=["tracing.enabled=true"])


def test_no_collector_at_the_endpoint_turns_tracing_off_with_a_warning(cfg, monkeypatch, caplog):
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    with caplog.at_level(logging.WARNING, logger="asyncrl.telemetry.tracing"):
        assert tracing.init_tracing(cfg, "test") is False
    assert f"no OTLP collector answers at http://127.0.0.1:{port}" in caplog.text
    assert tracing._provider is None


def test_a_listening_collector_or_another_exporter_is_not_questioned(cfg, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"127.0.0.1:{server.getsockname()[1]}")
        assert tracing.missing_collector(cfg) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert tracing.missing_collector(cfg) == "http://127.0.0.1:1"
    file_cfg = load_config(overrides=["tracing.enabled=true", "tracing.exporter=file"])
    assert tracing.missing_collector(file_cfg) is None


def test_every_exporter_of_a_list_gets_the_spans_and_a_missing_collector_drops_only_otlp(
    cfg, monkeypatch, tmp_path, caplog
):
    """``OTEL_TRACES_EXPORTER=otlp,file`` (the spec's list form) was refused at start-up;
    with no collector up, the file still gets every span."""
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,file")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    here = load_config(overrides=[f"output_dir='{tmp_path}'"])
    try:
        with caplog.at_level(logging.WARNING, logger="asyncrl.telemetry.tracing"):
            assert tracing.init_tracing(here, "test") is True
        assert "spans go to file only: no OTLP collector answers" in caplog.text
        with tracing.tracer().start_as_current_span("one"):
            pass
    finally:
        tracing.shutdown_tracing()
    (written,) = (here.run_dir / "traces").glob("*.jsonl")
    assert '"name": "one"' in written.read_text()


@pytest.mark.parametrize(
    ("arg", "ratio"), [(None, 0.5), ("0.1", 0.1), ("0", 0.0), ("1.5", 0.5), ("ten", 0.5)]
)
def test_otel_traces_sampler_arg_alone_sets_the_ratio(monkeypatch, arg, ratio):
    """The docs say OTEL_TRACES_SAMPLER/_ARG override tracing.sample_ratio; _ARG alone was
    ignored (the SDK reads it only beside OTEL_TRACES_SAMPLER), so every trace was kept."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    if arg is None:
        monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    else:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    half = load_config(overrides=["tracing.sample_ratio=0.5"])
    try:
        assert tracing.init_tracing(half, "test") is True
        assert tracing._provider.sampler.get_description() == (
            f"ParentBased{{root:TraceIdRatioBased{{{ratio}}},"
            "remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,"
            "localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"
        )
    finally:
        tracing.shutdown_tracing()


def test_otel_traces_sampler_wins_with_its_arg(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    try:
        assert tracing.init_tracing(load_config(overrides=[]), "test") is True
        assert tracing._provider.sampler.get_description() == "TraceIdRatioBased{0.25}"
    finally:
        tracing.shutdown_tracing()


def test_a_process_is_told_apart_when_otel_service_name_renames_them_all(monkeypatch):
    """``OTEL_SERVICE_NAME=job asyncrl run``: the launcher passes it to every role, so the
    trainer and each worker were all ``job``, with nothing saying which was which."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "job")
    try:
        assert tracing.init_tracing(load_config(overrides=[]), "asyncrl-trainer") is True
        attrs = tracing._provider.resource.attributes
        assert attrs["service.name"] == "job"
        assert attrs["asyncrl.process"] == "asyncrl-trainer"
    finally:
        tracing.shutdown_tracing()
