"""The ``tracing`` section: OpenTelemetry traces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import Strict


class TracingConfig(Strict):
    """OpenTelemetry traces (docs/observability.md). The OTEL_* environment variables apply."""

    enabled: bool = False
    """Trace rollout and training (also on when OTEL_TRACES_EXPORTER names an exporter)."""
    exporter: Literal["otlp", "console", "file"] = "otlp"
    """otlp: to OTEL_EXPORTER_OTLP_ENDPOINT (a collector, Jaeger); console: each process's log
    (<run_dir>/logs/<role>.log, the launcher's logs/launcher.log); file: JSON lines in
    <run_dir>/traces/<process>.jsonl. OTEL_TRACES_EXPORTER overrides it."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of traces recorded, decided at each root (a sample, a step, a sync); children follow."""
