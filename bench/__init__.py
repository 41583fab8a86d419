"""``asyncrl bench ...``: benchmarks that print their figures and ratios side by side from one
invocation (learn, sync-pause, tracing, modes, sync, transport, tools)."""
