"""The ``sim`` section: the sim engine's latency model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import Strict


class SimConfig(Strict):
    """The `sim` engine's latency model (rollout.name=sim): benchmarks of the pipeline at scale."""

    decode_step_s: float = Field(0.004, gt=0, le=60)
    """Modelled time of one decoding step of a replica of at most `capacity` sequences, each
    getting one token (see scheduling for more)."""
    capacity: int = Field(64, ge=1)
    """Sequences one replica (rollout worker) decodes per step at full speed (see scheduling)."""
    scheduling: Literal["fcfs", "shared"] = "fcfs"
    """fcfs: a step takes decode_step_s and gives the first `capacity` sequences a token, the
    rest wait their turn. shared (continuous batching, as vLLM): a step gives every active
    sequence a token and takes decode_step_s x max(1, active / capacity)."""
    long_tail_fraction: float = Field(0.1, ge=0, le=1)
    """Share of responses that run to 80-100% of data.max_response_length (long-CoT tail)."""
    short_mean_fraction: float = Field(0.15, gt=0, le=1)
    """Mean length of the other responses (exponential), as a fraction of max_response_length."""
    train_s_per_sample: float = Field(0.02, ge=0)
    """Modelled trainer time per sample (all its trajectories); replaces the GRPO update."""
    seed: int = 0
    """Seed of the length draws (each request's length is a function of its id and this)."""
