"""The trainer's spans: one per step, linked to every sample it trained on, and one per sync.

``train.step`` carries a **link** to the ``send <run>.samples`` span of each sample in its
batch (the context rides in the sample's Kafka headers), so a trace viewer goes from a step to
the rollouts that fed it, across processes; each of those samples' traces gets a ``process
<run>.samples`` span naming the step and linked to it, the way from a rollout to its step.
``weight_sync`` (linked to the step that triggered it) holds ``sync.pause`` and
``sync.transfer``; SyncRequested and WeightsPublished are sent inside it, so each worker's
``sync.pause`` and ``weights.load`` spans join the same trace. No-ops when tracing is off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind

from asyncrl.kafka import Record
from asyncrl.telemetry import tracing
from asyncrl.telemetry.metrics import stale_in_step

STEP_ATTRIBUTES = {
    "asyncrl.loss": "actor/pg_loss",
    "asyncrl.partial_ratio": "fully_async/partial/partial_ratio",
    "asyncrl.reward_mean": "critic/score/mean",
}


def start_step(batch: Sequence[Record[Any]], step: int, version: int, topic: str) -> Span:
    """The ``train.step`` span of the step about to run (not current; use ``use_span``)."""
    if not tracing.active():
        return trace.INVALID_SPAN
    links = [
        Link(sc, {"messaging.kafka.offset": r.offset})
        for r in batch
        if (sc := tracing.span_context_from_headers(r.headers)) is not None
    ]
    attributes: dict[str, Any] = {
        "messaging.batch.message_count": len(batch),
        "asyncrl.step": step,
        "asyncrl.version": version,
        "asyncrl.batch_size": len(batch),
    }
    span = tracing.tracer().start_span(
        "train.step",
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=tracing.messaging_attributes(topic, "process", **attributes),
    )
    _mark_samples(batch, span, step, version, topic)
    return span


def _mark_samples(
    batch: Sequence[Record[Any]], step_span: Span, step: int, version: int, topic: str
) -> None:
    """In each sample's own trace, a ``process <run>.samples`` span (child of the sample's send
    span, linked to ``train.step``) naming the step that trained it. A link points one way:
    with the step's links alone, a viewer showing a sample's trace (Jaeger, by trace id) would
    show no sign of the trainer, and no viewer searches spans by the links they carry."""
    step_link = [Link(step_span.get_span_context())]
    for r in batch:
        ctx = tracing.context_from_headers(r.headers)
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            continue
        tracing.tracer().start_span(
            f"process {topic}",
            context=ctx,
            kind=SpanKind.CONSUMER,
            links=step_link,
            attributes=tracing.messaging_attributes(
                topic,
                "process",
                r.key,
                **{
                    "messaging.kafka.offset": r.offset,
                    "messaging.destination.partition.id": str(r.partition),
                    "asyncrl.step": step,
                    "asyncrl.version": version,
                },
            ),
        ).end()


def end_step(span: Span, metrics: dict[str, float]) -> None:
    """Put the step's figures on its span (loss, stale count, ...). ``asyncrl.stale_samples``
    is this step's count (samples at least one version behind), not verl's running total."""
    if span.is_recording():
        for attr, key in STEP_ATTRIBUTES.items():
            if key in metrics:
                span.set_attribute(attr, float(metrics[key]))
        span.set_attribute("asyncrl.stale_samples", float(stale_in_step(metrics)))


def sync_span(version: int, trigger: Span) -> Span:
    """The ``weight_sync`` span of ``version``, linked to the step that triggered it."""
    if not tracing.active():
        return trace.INVALID_SPAN
    sc = trigger.get_span_context()
    return tracing.tracer().start_span(
        "weight_sync",
        links=[Link(sc)] if sc.is_valid else None,
        attributes={"asyncrl.version": version},
    )


def phase(name: str, **attributes: Any):
    """A child span of the current one (sync.pause, sync.transfer)."""
    return tracing.tracer().start_as_current_span(name, attributes=attributes)
