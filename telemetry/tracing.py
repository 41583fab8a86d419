"""OpenTelemetry tracing across rollout and training, with the context carried in Kafka headers.

Off by default. On with ``tracing.enabled=true`` or when ``OTEL_TRACES_EXPORTER`` names an
exporter (``otlp``, ``console``, ``file`` or a comma-separated list; ``none`` keeps it off). The OTLP exporter is configured the
standard way (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL`` =
``http/protobuf`` (default) or ``grpc``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...);
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the process; ``OTEL_TRACES_SAMPLER``
(or ``OTEL_TRACES_SAMPLER_ARG`` alone, a ratio) overrides ``tracing.sample_ratio``. For local
runs ``tracing.exporter=file`` writes one JSON span per line to
``<run_dir>/traces/<service>.jsonl``.

When tracing is off every call here is the API's no-op and nothing is added to the headers,
so the data path pays (almost) nothing.

The W3C trace context travels in the Kafka headers ``traceparent``/``tracestate`` of every
message the project produces through :class:`asyncrl.kafka.Publisher` (samples, partial
segments, control events, prompts). Attribute names follow OpenTelemetry's messaging semantic
conventions: a ``send <topic>`` PRODUCER span per message, ``messaging.system=kafka``,
``messaging.destination.name``, ``messaging.kafka.offset`` (set when the broker acknowledges),
``messaging.batch.message_count`` on a batch's span.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Link, Span, SpanContext, SpanKind

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult

    from asyncrl.config import RunConfig

__all__ = [
    "MESSAGING_SYSTEM",
    "SpanKind",
    "context_from_headers",
    "inject_headers",
    "init_tracing",
    "link_from_headers",
    "shutdown_tracing",
    "tracer",
]

TRACER_NAME = "asyncrl"
MESSAGING_SYSTEM = "kafka"
TRACE_HEADERS = ("traceparent", "tracestate")

log = logging.getLogger(__name__)

_provider: Any = None  # the SDK TracerProvider this process installed, if any
_NOOP = trace.NoOpTracer()
_lock = threading.Lock()


def active() -> bool:
    """Whether this process installed a tracer provider (the data path checks this first)."""
    return _provider is not None


def tracer() -> trace.Tracer:
    """The project's tracer (a no-op until :func:`init_tracing` turned tracing on).

    It comes from this module's provider, not OpenTelemetry's global one, which can be set only
    once per process: a process that runs several runs (a benchmark, the test suite) turns
    tracing on and off per run.
    """
    provider = _provider
    return provider.get_tracer(TRACER_NAME) if provider is not None else _NOOP


def enabled_by(cfg: RunConfig) -> bool:
    """Whether this run traces: the config says so, or ``OTEL_TRACES_EXPORTER`` does."""
    env = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return cfg.tracing.enabled or (env not in ("", "none"))


def init_tracing(
    cfg: RunConfig, service: str, exporter: Any = None, console_log: Path | None = None
) -> bool:
    """Install this process's tracer provider (once); returns whether tracing is on.

    ``service`` names the process in the trace viewer (``asyncrl-trainer``,
    ``asyncrl-rollout-0``, ...) unless ``OTEL_SERVICE_NAME`` is set. ``exporter`` replaces
    the configured one (tests pass an in-memory exporter) and turns tracing on.
    ``console_log``: the file the console exporter writes to, for a process whose stdout is
    the user's terminal (the launcher: its spans drowned the live progress); by default
    stdout, which is a role's log file.
    """
    global _provider
    if exporter is None and not enabled_by(cfg):
        return False
    with _lock:
        if _provider is not None:
            return True
        kinds = exporter_kinds(cfg)
        if exporter is None and (missing := missing_collector(cfg)) is not None:
            kinds = tuple(kind for kind in kinds if kind != "otlp")
            log.warning(
                "%s: no OTLP collector answers at %s (start one, such as Jaeger: "
                "docs/observability.md; or tracing.exporter=file). Exporting to it would "
                "have retried for ~30 s at the end of each process",
                f"spans go to {', '.join(kinds)} only" if kinds else "tracing is off",
                missing,
            )
            if not kinds:
                return False
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        attrs = {
            SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", service),
            "asyncrl.run_id": cfg.run_id,
            # Which process, whatever OTEL_SERVICE_NAME says: `asyncrl run` passes its
            # environment to every role, so a name set there is every process's.
            "asyncrl.process": service,
        }
        sampler = None  # the SDK reads OTEL_TRACES_SAMPLER / _ARG when set
        if "OTEL_TRACES_SAMPLER" not in os.environ:
            sampler = ParentBased(TraceIdRatioBased(sample_ratio(cfg)))
        provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
        exporters = (
            [exporter]
            if exporter is not None
            else [_exporter(cfg, kind, service, console_log) for kind in kinds]
        )
        for each in exporters:
            provider.add_span_processor(BatchSpanProcessor(each))
        _provider = provider
        atexit.register(shutdown_tracing)
    return True


EXPORTERS = ("otlp", "console", "file")

GRPC_MISSING = (
    "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: "
    "pip install 'asyncrl[otlp-grpc]' (or use http/protobuf, port 4318)"
)


def exporter_problem(cfg: RunConfig) -> str | None:
    """Why this process could not make its span exporter, or None (it can, or tracing is off).

    The start-up checks ask it, so ``OTEL_TRACES_EXPORTER=jaeger`` stops a run at once
    naming the variable: the launcher died in a ValueError traceback from its first span.
    """
    if not enabled_by(cfg):
        return None
    kinds = exporter_kinds(cfg)
    unknown = [kind for kind in kinds if kind not in EXPORTERS]
    if unknown or not kinds:
        return (
            f"OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER', '')!r}: asyncrl "
            "exports to otlp, console and file, one or a comma-separated list (none: off)"
            + (f"; it has no {', '.join(unknown)} exporter" if unknown else "")
        )
    if "otlp" in kinds and _otlp_protocol() == "grpc":
        import importlib.util

        try:
            grpc = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc")
        except ModuleNotFoundError:
            grpc = None
        if grpc is None:
            return GRPC_MISSING
    return None


def sample_ratio(cfg: RunConfig) -> float:
    """The share of root spans recorded: ``OTEL_TRACES_SAMPLER_ARG`` where it is set alone
    (it is the argument of the ratio sampler asyncrl uses; the SDK reads it only beside
    ``OTEL_TRACES_SAMPLER``, so alone it changed nothing), else ``tracing.sample_ratio``.
    A value that is no ratio is warned about and left out, as the SDK does."""
    arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if not arg:
        return cfg.tracing.sample_ratio
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        log.warning(
            "OTEL_TRACES_SAMPLER_ARG=%r is not a ratio in [0, 1]: tracing.sample_ratio=%s applies",
            arg,
            cfg.tracing.sample_ratio,
        )
        return cfg.tracing.sample_ratio
    return ratio


def missing_collector(cfg: RunConfig) -> str | None:
    """The OTLP endpoint, where the exporter is OTLP and nothing accepts a connection there;
    else None."""
    from asyncrl.kafka.health import accepts_connection

    if "otlp" not in exporter_kinds(cfg):
        return None
    grpc = _otlp_protocol() == "grpc"
    endpoint = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
    ) or ("http://localhost:4317" if grpc else "http://localhost:4318")
    url = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    host = url.hostname or "localhost"
    port = url.port or (443 if url.scheme == "https" else 4317 if grpc else 4318)
    return None if accepts_connection(host, port, 1.0) else endpoint


def exporter_kinds(cfg: RunConfig) -> tuple[str, ...]:
    """The exporters OTEL_TRACES_EXPORTER names, where set (and not none): one, or the spec's
    comma-separated list (``otlp,console``: every span goes to each); else
    ``tracing.exporter``."""
    env = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if env in ("", "none"):
        return (cfg.tracing.exporter,)
    return tuple(dict.fromkeys(kind.strip() for kind in env.split(",") if kind.strip()))


def _otlp_protocol() -> str:
    """The OTLP exporter's protocol, as the SDK reads it (http/protobuf by default)."""
    return os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    )


def _exporter(cfg: RunConfig, kind: str, service: str, console_log: Path | None = None):
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        if console_log is not None:
            return ConsoleFileSpanExporter(service, console_log)
        return ConsoleSpanExporter(service_name=service)
    if kind == "file":
        return JsonLinesSpanExporter(cfg.run_dir / "traces" / f"{service}.jsonl")
    if kind != "otlp":
        raise ValueError(f"tracing.exporter / OTEL_TRACES_EXPORTER: unknown exporter {kind!r}")
    if _otlp_protocol() == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError as err:
            raise RuntimeError(GRPC_MISSING) from err
        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def shutdown_tracing() -> None:
    """Export what is buffered and turn tracing off (called at exit; safe to call twice)."""
    global _provider
    with _lock:
        provider, _provider = _provider, None
    if provider is not None:
        provider.shutdown()


class JsonLinesSpanExporter:
    """Writes each finished span as one JSON line (the SDK's own JSON form) to a file.

    For local runs and tests: readable with ``jq``, and the same file the tests compare across
    processes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")  # noqa: SIM115 (closed by shutdown)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [json.dumps(json.loads(s.to_json(indent=None))) + "\n" for s in spans]
        with self._lock:
            self._file.writelines(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


class ConsoleFileSpanExporter:
    """The SDK's console exporter (its pretty-printed JSON), into a file it closes at shutdown."""

    def __init__(self, service: str, path: Path) -> None:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a")  # noqa: SIM115 (closed by shutdown)
        self._console = ConsoleSpanExporter(service_name=service, out=self._file)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._console.export(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        self._file.close()


# --- context in Kafka headers ---------------------------------------------------------------
def inject_headers(headers: dict[str, str | bytes], span: Span | None = None) -> None:
    """Add ``traceparent``/``tracestate`` of ``span`` (default: the current one) to headers.

    Adds nothing when there is no sampled span (tracing off)."""
    ctx = trace.set_span_in_context(span) if span is not None else None
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    headers.update(carrier)


def context_from_headers(headers: Mapping[str, bytes | str] | None) -> otel_context.Context:
    """The context a message was produced in (an empty context if it carries none)."""
    carrier = {
        k: v.decode(errors="replace") if isinstance(v, bytes) else v
        for k, v in (headers or {}).items()
        if k in TRACE_HEADERS
    }
    return extract(carrier)


def span_context_from_headers(headers: Mapping[str, bytes | str] | None) -> SpanContext | None:
    sc = trace.get_current_span(context_from_headers(headers)).get_span_context()
    return sc if sc.is_valid else None


def link_from_headers(headers: Mapping[str, bytes | str] | None, **attributes: Any) -> Link | None:
    """A span link to the producer span of a message, or None if it carries no context."""
    sc = span_context_from_headers(headers)
    return Link(sc, attributes or None) if sc is not None else None


def links_from(all_headers: Iterable[Mapping[str, bytes | str] | None]) -> list[Link]:
    return [link for h in all_headers if (link := link_from_headers(h)) is not None]


def messaging_attributes(
    topic: str, operation: str, key: str | None = None, **extra: Any
) -> dict[str, Any]:
    """Messaging semantic-convention attributes of a Kafka operation (send/receive/process)."""
    attrs: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if key is not None:
        attrs["messaging.kafka.message.key"] = key
    attrs.update(extra)
    return attrs
