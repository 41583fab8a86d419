"""What every process reports about itself: OpenTelemetry traces (``tracing``) and the metric
writers and clocks behind ``metrics.jsonl`` and TensorBoard (``metrics``)."""
