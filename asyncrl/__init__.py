"""asyncrl: fully asynchronous RL post-training for LLMs over a Kafka event log.

Subpackages map to the repository's top-level folders, which are layers (docs/design.md,
"Layers"): ``asyncrl.schemas`` (wire contract), ``asyncrl.config``, ``asyncrl.kafka`` and
``asyncrl.telemetry``, ``asyncrl.sync`` (weight versions and transfer), ``asyncrl.producers``
(rollout) and ``asyncrl.consumers`` (trainer), ``asyncrl.launch``, ``asyncrl.ops`` (operator
tools) and ``asyncrl.bench``.
"""

__version__ = "0.1.0"
