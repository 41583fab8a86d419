"""A span exporter asyncrl cannot make stops the run at start-up, naming the variable:
``OTEL_TRACES_EXPORTER=jaeger asyncrl run`` died in a ValueError traceback from the
launcher's first span, after the broker and the warm start."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.preflight import check_startable, startup_checks


def _tracing_check(monkeypatch: pytest.MonkeyPatch, **env: str):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = load_config(overrides=[])
    (check,) = [c for c in startup_checks(cfg, "run") if c.key.startswith("tracing")]
    return cfg, check


@pytest.mark.parametrize("value", ["jaeger", "console,jaeger", ","])
def test_an_unknown_otel_traces_exporter_is_refused_naming_it(monkeypatch, value):
    cfg, check = _tracing_check(monkeypatch, OTEL_TRACES_EXPORTER=value)
    assert check.ok is False
    assert f"OTEL_TRACES_EXPORTER={value!r}" in check.detail
    assert "otlp, console and file" in check.detail
    assert ("no jaeger exporter" in check.detail) == ("jaeger" in value)
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        check_startable(cfg, "train")


def test_grpc_without_its_exporter_package_is_refused(monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401

        pytest.skip("the gRPC exporter is installed here")
    except ImportError:
        pass
    _, check = _tracing_check(
        monkeypatch, OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="grpc"
    )
    assert check.ok is False
    assert "asyncrl[otlp-grpc]" in check.detail


@pytest.mark.parametrize(
    ("env", "ok"),
    [
        ({}, "off"),
        ({"OTEL_TRACES_EXPORTER": "none"}, "off"),
        ({"OTEL_TRACES_EXPORTER": "jaeger", "OTEL_SDK_DISABLED": "true"}, "off"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "file"}, "file"),
        # The spec's list form (was refused): each named exporter gets every span.
        ({"OTEL_TRACES_EXPORTER": "console, file,console"}, "console,file"),
    ],
)
def test_known_exporters_and_tracing_off_pass(monkeypatch, env, ok):
    _, check = _tracing_check(monkeypatch, **env)
    assert check.ok is True
    assert check.detail == ok


def test_the_dry_run_says_when_no_otlp_collector_answers(monkeypatch):
    """`asyncrl run --dry-run tracing.enabled=true` said "ok tracing.exporter: otlp" with
    nothing at the endpoint; the run then warned in every process and traced nothing."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    _, check = _tracing_check(monkeypatch, OTEL_TRACES_EXPORTER="otlp")
    assert check.ok is True  # the run starts: a collector may be up by then
    assert f"no OTLP collector answers at http://127.0.0.1:{port}" in check.detail
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}"
        )
        _, check = _tracing_check(monkeypatch, OTEL_TRACES_EXPORTER="otlp")
        assert check.detail == "otlp"


def test_the_dry_run_says_the_other_exporters_of_a_list_still_get_the_spans(monkeypatch):
    """`OTEL_TRACES_EXPORTER=otlp,console asyncrl run --dry-run` with no collector said each
    process would trace nothing; the run then sent every span to the console, as the docs say
    (docs/observability.md: with no OTLP collector up, the others still get them)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    _, check = _tracing_check(monkeypatch, OTEL_TRACES_EXPORTER="otlp,console")
    assert check.ok is True
    assert "traces nothing" not in check.detail
    assert check.detail.endswith("each process warns and sends its spans to console only")
    _, check = _tracing_check(monkeypatch, OTEL_TRACES_EXPORTER="otlp")
    assert check.detail.endswith("each process warns and traces nothing")
