"""Operator tooling: config, CLI, embedded broker, topic admin, Kafka clients, progress."""
