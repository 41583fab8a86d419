"""Typed run configuration: one YAML file per run plus dotted overrides on the command line.

Key names follow verl where verl has them (``async_training.staleness_threshold``,
``actor_rollout_ref.rollout.n``, ...) so a verl user recognises every knob. Everything is
validated at load: an unknown key or a bad value fails at start-up with the key named.
This package imports pydantic and yaml only (no torch), so the CLI answers instantly.

``sections`` holds the models (``kafka`` the Kafka section), ``load`` reads a YAML file and
overrides in asyncrl's names or verl's (``verl_keys`` says how each verl key is taken),
``keys`` is the catalogue of valid keys.
"""

from asyncrl.config.base import DEFAULT_CONFIG, ConfigError, Strict
from asyncrl.config.kafka import (
    DEFAULT_PARTITIONS,
    EMBEDDED_SESSION_TIMEOUT_MS,
    EXTERNAL_SESSION_TIMEOUT_MS,
    SECRET_HINTS,
    KafkaConfig,
    KafkaSecurityConfig,
    TopicsConfig,
)
from asyncrl.config.load import dump_config, load_config
from asyncrl.config.overrides import DELETE, parse_overrides
from asyncrl.config.sections import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    AsyncTrainingConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    ModelConfig,
    MultiTurnConfig,
    OptimConfig,
    RayConfig,
    RolloutConfig,
    RunConfig,
    SimConfig,
    SyncConfig,
    TracingConfig,
    TrainerConfig,
    ValKwargsConfig,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_PARTITIONS",
    "DELETE",
    "EMBEDDED_SESSION_TIMEOUT_MS",
    "EXTERNAL_SESSION_TIMEOUT_MS",
    "SECRET_HINTS",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "AsyncTrainingConfig",
    "ConfigError",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "KafkaConfig",
    "KafkaSecurityConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "RayConfig",
    "RolloutConfig",
    "RunConfig",
    "SimConfig",
    "Strict",
    "SyncConfig",
    "TopicsConfig",
    "TracingConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "dump_config",
    "load_config",
    "parse_overrides",
]
