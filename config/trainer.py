"""The ``trainer`` section: steps, evaluation, checkpoints, restarts and resuming."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from asyncrl.config.base import Strict


def _console_logger() -> list[Literal["console", "tensorboard"]]:
    """The default of trainer.logger (a typed factory: a lambda's list would be list[str])."""
    return ["console"]


RESUME_WHY = (
    "asyncrl resumes a run only from its own last checkpoint (trainer.resume_mode=auto, the run "
    "named by output_dir and run_id); to start a new run from the policy of a run's step N: "
    "`asyncrl export-model RUN --step N --out DIR`, then actor_rollout_ref.model.path=DIR"
)
"""Why verl's resume_path and resume_from_path are refused, and what to do instead."""


class TrainerConfig(Strict):
    total_training_steps: int = Field(100, ge=1)
    """Local updates to run; the run ends here (or earlier at target_accuracy)."""
    test_freq: int = Field(5, ge=0)
    """Evaluate held-out accuracy every this many steps (0 = only at the end)."""
    save_freq: int = Field(10, ge=0)
    """Write a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """How many of the newest checkpoints to keep (older ones are deleted)."""
    target_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop early once held-out accuracy reaches this."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the trainer's model lives (auto: cuda when available)."""
    max_restarts: int = Field(3, ge=0)
    """`asyncrl run` restarts a trainer that dies, up to this many times; the restarted
    trainer resumes from its last checkpoint, the workers join it, and the steps after that
    checkpoint are trained again. 0: the trainer's death fails the run."""
    resume_mode: Literal["auto", "disable"] = "auto"
    """verl's key, read by `asyncrl run` when the run's directory holds an earlier launch. auto:
    an unfinished run (killed, crashed, its broker died) is resumed from its archived log and
    last checkpoint, with the new command line's values; a key the run's log and checkpoints
    were made with (actor_rollout_ref.model.*, rollout.n, actor.ppo_mini_batch_size,
    async_training.require_batches and partial_rollout, data.*, kafka.topics.partitions)
    changed since its config.yaml is refused at start-up, naming it. A finished run is moved
    aside to <run_dir>.<time> and a new one starts (with kafka.bootstrap_servers set: the
    command says it has finished and starts nothing). disable: the earlier
    run is moved aside, finished or not, and the run starts afresh. With kafka.bootstrap_servers
    set the earlier run's log stays on that broker, so disable refuses a directory holding its
    checkpoints, in asyncrl run and in asyncrl prepare (a fresh run needs a run_id of its own).
    A trainer started by hand (asyncrl train), or restarted within a launch, always resumes from
    its run's last checkpoint; on a
    run whose log ends with RunFinished it says so and exits 0, as a rollout worker does.
    verl's resume_path (with trainer.resume_from_path) is refused at start-up, naming the key:
    a run goes on only from its own last checkpoint, which its log continues; asyncrl
    export-model RUN --step N --out DIR, then actor_rollout_ref.model.path=DIR, starts a new
    run from the policy of any step a run kept."""

    @field_validator("resume_mode", mode="before")
    @classmethod
    def _no_resume_path(cls, mode: Any) -> Any:
        if mode == "resume_path":
            raise ValueError(
                f"resume_path (verl's: resume from trainer.resume_from_path): {RESUME_WHY}"
            )
        return mode

    nnodes: int = Field(1, ge=1)
    """verl's key: machines the trainer's ranks run on. `asyncrl run` starts its ranks on its
    own machine, so more than 1 is refused there, naming this key; ranks started by hand
    (torchrun ... -m asyncrl train) may span machines."""
    n_gpus_per_node: int = Field(1, ge=1)
    """verl's key: trainer ranks per machine; trainer.nnodes x trainer.n_gpus_per_node ranks
    shard the policy's weights, gradients and AdamW state with FSDP2 (one GPU each on CUDA,
    NCCL; processes on the CPU, gloo). 1: one trainer process holding the whole policy.
    actor.ppo_mini_batch_size is the global mini-batch, split evenly over the ranks."""

    @property
    def ranks(self) -> int:
        """The trainer's ranks: nnodes x n_gpus_per_node."""
        return self.nnodes * self.n_gpus_per_node

    seed: int = 0
    """Seed of the trainer's RNG (rollout workers derive theirs from it)."""
    torch_threads: int = Field(1, ge=1)
    """CPU threads of the trainer process (rollout and training share the machine's cores)."""
    logger: list[Literal["console", "tensorboard"]] = Field(default_factory=_console_logger)
    """Where step metrics go besides metrics.jsonl and the steps topic (verl's key): console
    (the progress bar), tensorboard (<run_dir>/tensorboard; pip install 'asyncrl[tensorboard]')."""
