"""Operator tools: what a person runs against a run's log (inspect, replay, audit, report,
monitor) and the generated config reference. Runtime code never imports these."""
