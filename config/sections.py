"""The run config: one typed section per concern, verl's key names where verl has the setting.

Each section is a module of its own, named by its key (``data``, ``actor_rollout_ref.rollout``
in ``rollout``, ``custom_reward_function`` in ``reward``, ...); this one holds ``RunConfig``,
which puts them together and checks what spans sections. Every field has a docstring;
``docs/configuration.md`` is generated from them (``python -m asyncrl.ops.config_docs``)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from asyncrl.config.actor import ActorConfig, FsdpConfig, OptimConfig
from asyncrl.config.algorithm import AlgorithmConfig, OverlongBufferConfig
from asyncrl.config.async_training import AsyncTrainingConfig
from asyncrl.config.base import Strict
from asyncrl.config.data import COUNTDOWN_PROBLEMS, DataConfig, file_paths
from asyncrl.config.kafka import KafkaConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.config.ray import RayConfig
from asyncrl.config.reward import CustomRewardFunctionConfig
from asyncrl.config.rollout import MultiTurnConfig, RolloutConfig, ValKwargsConfig
from asyncrl.config.sim import SimConfig
from asyncrl.config.sync import SyncConfig
from asyncrl.config.tracing import TracingConfig
from asyncrl.config.trainer import RESUME_WHY, TrainerConfig

__all__ = [
    "COUNTDOWN_PROBLEMS",
    "RESUME_WHY",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "AsyncTrainingConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FsdpConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "RayConfig",
    "RolloutConfig",
    "RunConfig",
    "SimConfig",
    "SyncConfig",
    "TracingConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "file_paths",
]


class ActorRolloutRefConfig(Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    nccl_timeout: int = Field(600, ge=1)
    """verl's key: seconds a trainer rank waits in one collective (NCCL on GPUs, gloo on the
    CPU) before it fails, with trainer.n_gpus_per_node > 1: a rank that hangs is found within
    this time and the group restarts (`asyncrl run`, trainer.max_restarts)."""


class RunConfig(Strict):
    _run_dir: Path | None = PrivateAttr(default=None)
    run_id: str = Field("demo", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
    """Prefix of every topic of the run (run42.samples, ...)."""
    output_dir: str = "runs"
    """Checkpoints, metrics and logs go to output_dir/run_id."""
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = Field(default_factory=ActorRolloutRefConfig)
    custom_reward_function: CustomRewardFunctionConfig = Field(
        default_factory=CustomRewardFunctionConfig
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    async_training: AsyncTrainingConfig = Field(default_factory=AsyncTrainingConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    launcher: Literal["local", "ray"] = "local"
    """How `asyncrl run` starts the trainer and workers: local processes, or Ray actors."""
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("output_dir")
    @classmethod
    def _expand_home(cls, path: str) -> str:
        """``~`` expanded, as in model.path and the data files (the shell leaves it alone in
        ``output_dir=~/runs``, after the ``=``)."""
        return os.path.expanduser(path)

    @model_validator(mode="after")
    def _check_overlong(self) -> RunConfig:
        buffer = self.algorithm.overlong_buffer
        end = buffer.end(self.data.max_response_length)
        if buffer.enable and buffer.len >= end:
            raise ValueError(
                f"algorithm.overlong_buffer.len={buffer.len} is not below the length it ends "
                f"at ({end}: algorithm.overlong_buffer.max_resp_len, else "
                "data.max_response_length): every response would be penalised"
            )
        return self

    @model_validator(mode="after")
    def _check_partial(self) -> RunConfig:
        at = self.async_training
        if at.partial_rollout and at.staleness_threshold == 0:
            raise ValueError(
                "async_training.partial_rollout=True needs async_training.staleness_threshold > 0"
            )
        if at.in_flight_update and not at.partial_rollout:
            raise ValueError(
                "async_training.in_flight_update=True needs async_training.partial_rollout=True "
                "(samples in flight at a sync go on under the new weights, as segments)"
            )
        multi_turn = self.actor_rollout_ref.rollout.multi_turn
        if self.data.task == "calculator" and not multi_turn.enable:
            raise ValueError(
                "data.task=calculator needs actor_rollout_ref.rollout.multi_turn.enable=true "
                "(the model answers it by calling the calculator tool)"
            )
        if at.stale_token_action == "drop" and at.max_token_version_lag is None:
            raise ValueError(
                "async_training.stale_token_action=drop needs "
                "async_training.max_token_version_lag: it says what happens to a trajectory "
                "with tokens past that lag, and without it every token is trained"
            )
        correction = self.algorithm.rollout_correction
        if correction.rollout_is_batch_normalize and correction.rollout_is is None:
            raise ValueError(
                "algorithm.rollout_correction.rollout_is_batch_normalize=true needs "
                "algorithm.rollout_correction.rollout_is (token or sequence): it normalises the "
                "importance weights, and without rollout_is there are none"
            )
        if correction.enabled and not at.compute_prox_log_prob:
            raise ValueError(
                "algorithm.rollout_correction.rollout_is/rollout_rs need "
                "async_training.compute_prox_log_prob=true: they compare the rollout's "
                "log-probs with the trainer's (verl's bypass_mode is not supported)"
            )
        if multi_turn.interaction_config_path is not None and not multi_turn.enable:
            raise ValueError(
                "actor_rollout_ref.rollout.multi_turn.interaction_config_path needs "
                "actor_rollout_ref.rollout.multi_turn.enable=true (a user replies to the "
                "agent loop's answers)"
            )
        if multi_turn.enable and self.actor_rollout_ref.rollout.name == "sim":
            raise ValueError(
                "actor_rollout_ref.rollout.multi_turn.enable=true needs rollout.name=hf or hf_cached "
                "(the sim engine models latency, it writes no text to call tools with)"
            )
        return self

    # --- derived quantities (docs/design.md, "Versions and the budget") ---------------------
    @property
    def required_samples(self) -> int:
        """Samples per local update: ppo_mini_batch_size x require_batches."""
        return (
            self.actor_rollout_ref.actor.ppo_mini_batch_size * self.async_training.require_batches
        )

    @property
    def samples_per_version(self) -> int:
        """Samples the trainer consumes between two syncs."""
        return self.async_training.trigger_parameter_sync_step * self.required_samples

    @property
    def max_samples_per_version(self) -> int:
        """(1 + staleness_threshold) x trigger x required, before subtracting num_stale."""
        return math.floor((1 + self.async_training.staleness_threshold) * self.samples_per_version)

    @property
    def filters_groups(self) -> FilterGroupsConfig | None:
        """DAPO's dynamic sampling as the run applies it (``algorithm.filter_groups``), or None:
        off, or the sim engine's run, which trains nothing. The trainer leaves such groups out,
        and the worker that made one takes its budget slot back as it publishes it."""
        fg = self.algorithm.filter_groups
        return fg if fg.enable and self.actor_rollout_ref.rollout.name != "sim" else None

    @property
    def run_dir(self) -> Path:
        """output_dir/run_id, or the directory a finished run was read from (``at_dir``)."""
        return self._run_dir or Path(self.output_dir) / self.run_id

    def at_dir(self, run_dir: Path) -> RunConfig:
        """This run's files in ``run_dir`` rather than output_dir/run_id: a finished run
        moved aside by the next one of its run_id (runs/<id>.<time>), or copied elsewhere,
        read by the commands that read a run; its topics keep the run_id's names."""
        self._run_dir = Path(run_dir)
        self.output_dir = str(Path(run_dir).parent)
        return self

    def topic(self, name: str) -> str:
        """Full topic name for this run, e.g. topic('samples') -> 'demo.samples'."""
        return f"{self.run_id}.{name}"
