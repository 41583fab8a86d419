"""The trace of one sample on the rollout side, and of a worker's part in a sync.

A sample's spans, one trace from the prompt to the trainer's step:

    process <run>.prompts            CONSUMER, linked to the prompt's send span; open until
    |                                 the sample is published (or logged and handed back)
    +- generate                      one per segment: segment 0, then one per continuation
    |                                 after a sync interrupted it (attribute param_version)
    +- send <run>.partials           PRODUCER, at each interrupt (mode d)
    +- reward                        one per trajectory, as each finishes
    +- send <run>.samples            PRODUCER; its context rides in the sample's headers and
       |                              the trainer's train.step span links to it
       +- process <run>.samples      the trainer's: the step that trained it (consumers/spans)

A worker's sync spans are children of the trainer's ``weight_sync`` span, whose context rides
in SyncRequested's headers: ``sync.pause`` (stop admitting, interrupt, RolloutPaused) and
``weights.load`` (receive, checksum, WeightsLoaded).

Every method is a no-op when tracing is off.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from asyncrl.telemetry import tracing

INTERRUPTED_EVENT = "interrupted by a weight sync"
"""The event on a ``generate`` segment a sync cut short (mode (d)); docs/observability.md
quotes it, what a user searches a trace for."""


class SampleTrace:
    """The spans of one in-flight sample."""

    def __init__(self) -> None:
        self.root: Span | None = None
        self.segment: Span | None = None
        self.segments = 0

    def start(
        self,
        topic: str,
        sample_id: str,
        prompt_headers: Mapping[str, bytes],
        partition: int,
        offset: int,
        version: int,
        resumed_from_log: bool = False,
    ) -> None:
        """Open the sample's root span when its prompt is taken."""
        if not tracing.active():
            return
        link = tracing.link_from_headers(prompt_headers)
        self.root = tracing.tracer().start_span(
            f"process {topic}",
            kind=SpanKind.CONSUMER,
            links=[link] if link else None,
            attributes=tracing.messaging_attributes(
                topic,
                "process",
                sample_id,
                **{
                    "messaging.kafka.offset": offset,
                    "messaging.destination.partition.id": str(partition),
                    "asyncrl.sample_id": sample_id,
                    "asyncrl.param_version_start": version,
                    "asyncrl.resumed_from_log": resumed_from_log,
                },
            ),
        )

    def start_segment(self, version: int) -> None:
        """A generate span for the tokens produced under ``version``."""
        if self.root is None:
            return
        self.end_segment()
        self.segment = tracing.tracer().start_span(
            "generate",
            context=trace.set_span_in_context(self.root),
            attributes={"asyncrl.segment": self.segments, "asyncrl.param_version": version},
        )
        self.segments += 1

    def end_segment(self, interrupted: bool = False, tokens: int | None = None) -> None:
        if self.segment is None:
            return
        if interrupted:
            self.segment.add_event(INTERRUPTED_EVENT)
        if tokens is not None:
            self.segment.set_attribute("asyncrl.response_tokens", tokens)
        self.segment.end()
        self.segment = None

    @contextmanager
    def child(self, name: str, **attributes: Any) -> Iterator[None]:
        """A child span of the sample (reward), current while the block runs."""
        if self.root is None:
            yield
            return
        ctx = trace.set_span_in_context(self.root)
        with tracing.tracer().start_as_current_span(name, context=ctx, attributes=attributes):
            yield

    def start_child(self, name: str, **attributes: Any) -> Any:
        """A child span of the sample that the caller ends (a reward scored off the loop), or
        None when the sample is not traced."""
        if self.root is None:
            return None
        ctx = trace.set_span_in_context(self.root)
        return tracing.tracer().start_span(name, context=ctx, attributes=attributes)

    def current(self):
        """Make the root span current (a publish inside becomes its child send span)."""
        return trace.use_span(self.root, end_on_exit=False) if self.root else nullcontext()

    def end(self, status: str | None = None) -> None:
        """Close the sample's spans; ``status`` set means it did not end as a sample."""
        self.end_segment()
        if self.root is None:
            return
        if status is not None:
            self.root.set_status(Status(StatusCode.ERROR, status))
        self.root.end()
        self.root = None


@contextmanager
def sync_span(
    name: str,
    request_headers: Mapping[str, bytes],
    start_ns: int | None = None,
    **attributes: Any,
) -> Iterator[None]:
    """A worker-side sync span, child of the trainer's sync (from SyncRequested's headers).

    ``start_ns`` backdates it (``sync.pause`` starts when SyncRequested arrived, so in mode
    (c) it covers the wait for in-flight samples)."""
    if not tracing.active():
        yield
        return
    ctx = tracing.context_from_headers(request_headers)
    with tracing.tracer().start_as_current_span(
        name, context=ctx, attributes=attributes, start_time=start_ns
    ):
        yield
