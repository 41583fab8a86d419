"""asyncrl: fully asynchronous RL post-training for LLMs over a Kafka event log.

Subpackages map to the repository's role folders: ``asyncrl.producers`` (rollout),
``asyncrl.consumers`` (trainer), ``asyncrl.schemas`` (wire contract), ``asyncrl.sync``
(weight versions and transfer), ``asyncrl.ops`` (CLI, broker, admin, metrics).
"""

__version__ = "0.1.0"
