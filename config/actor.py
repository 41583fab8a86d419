"""The ``actor_rollout_ref.actor`` section: the PPO loss, its batching, and the optimizer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import Strict


class OptimConfig(Strict):
    lr: float = Field(3e-4, gt=0)
    """AdamW learning rate of the RL updates."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay of the RL updates."""
    grad_clip: float = Field(1.0, gt=0)
    """Gradients are clipped to this global norm before each optimizer step."""
    lr_warmup_steps: int = Field(-1, ge=-1)
    """Training steps of linear warm-up from 0 (verl's key; verl steps its scheduler once per
    training step, so does asyncrl). -1: lr_warmup_steps_ratio of trainer.total_training_steps."""
    lr_warmup_steps_ratio: float = Field(0.0, ge=0, le=1)
    """The warm-up as a share of trainer.total_training_steps, where lr_warmup_steps is -1."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """After the warm-up: the constant lr, or a cosine decay to min_lr_ratio x lr at
    trainer.total_training_steps (verl's key; its older name warmup_style loads too)."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """The cosine schedule's floor, and where its warm-up starts, as a share of lr."""
    num_cycles: float = Field(0.5, gt=0, le=1000)
    """Cosine waves over the run after the warm-up (0.5: one half-wave, lr down to the floor)."""


class FsdpConfig(Strict):
    """verl's ``actor_rollout_ref.actor.fsdp_config``: of it, the precision the trainer
    computes in (one process, no sharding: verl's other keys there are fixed or refused)."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """verl's key: the dtype the trainer's forward passes compute in (mixed precision: the
    weights, gradients and AdamW state stay float32, as verl's model_dtype fp32). auto:
    bfloat16 where the trainer runs on a GPU (verl's default), float32 on the CPU (the
    trainer's logprobs then equal a float32 rollout's exactly)."""


class ActorConfig(Strict):
    ppo_mini_batch_size: int = Field(8, ge=1, le=65536)
    """Prompts (samples) per mini-batch; each holds rollout.n trajectories (at most 65536)."""
    clip_ratio: float = Field(0.2, gt=0)
    """PPO clip range for the policy ratio: the ratio is clipped to [1 - clip_ratio_low,
    1 + clip_ratio_high], each this where unset."""
    clip_ratio_low: float | None = Field(None, gt=0)
    """The clip range below 1 (verl's key); None: clip_ratio. Unlike verl, whose YAML sets
    both to 0.2 so that clip_ratio alone changes nothing, clip_ratio sets the side left unset."""
    clip_ratio_high: float | None = Field(None, gt=0)
    """The clip range above 1 (verl's key); None: clip_ratio. DAPO's clip-higher sets 0.28
    with clip_ratio_low 0.2, so unlikely tokens of good answers can gain more."""
    clip_ratio_c: float | None = Field(3.0, gt=1)
    """Dual-clip PPO (verl's key and default): where the advantage is negative, the per-token
    loss is at most -A * clip_ratio_c, so a token whose ratio ran far above 1 (a stale sample
    the policy has since come to favour) stops pushing. null: no dual clip."""
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
    """How per-token losses are reduced (verl's modes): the mean over all tokens; the mean per
    sequence, then over sequences; the sum per sequence, then the mean over sequences; or the
    sum over all tokens divided by a constant, loss_scale_factor (Dr. GRPO: no length bias)."""
    entropy_coeff: float = Field(0.0, ge=-1e6, le=1e6)
    """The entropy bonus (verl's key and default 0): the loss is pg_loss - entropy_coeff x the
    policy's token entropy, aggregated as the loss (a positive value keeps it exploring)."""
    ppo_epochs: int = Field(1, ge=1, le=1000)
    """Passes over a step's mini-batches (verl's key): each pass takes one optimizer step per
    mini-batch, against the same old log-probs (recorded, or computed once before the first)."""
    use_kl_loss: bool = False
    """A KL loss against the reference policy, the one the run started from (verl's key; GRPO's
    original recipe): the trainer keeps a frozen copy of it (the model's memory again) and
    runs one more forward pass per mini-batch."""
    kl_loss_coef: float = Field(0.001, ge=0, le=1e6)
    """The KL loss's weight in the loss (verl's key and default)."""
    kl_loss_type: Literal["low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs"] = "low_var_kl"
    """The per-token KL estimate (verl's names): low_var_kl/k3 exp(r) - r - 1 with r = ref -
    logp (clamped to [-10, 10] as verl), kl/k1 logp - ref, mse/k2 (logp - ref)^2 / 2, abs
    |logp - ref|; aggregated by loss_agg_mode."""
    loss_scale_factor: float | None = Field(None, gt=0)
    """The constant seq-mean-token-sum-norm divides by (verl's key); None:
    data.max_response_length, as verl (which pads every response to that length)."""
    ppo_micro_batch_size_per_gpu: int | None = Field(None, ge=1)
    """Trajectories per forward and backward pass (verl's key): a mini-batch's gradient is
    accumulated over micro-batches of this many, the same update as one pass over all of it
    (to float rounding) in the memory of one micro-batch; so are the no-grad log-prob passes.
    None: each mini-batch in one pass. Not used with use_dynamic_bsz."""
    use_dynamic_bsz: bool = False
    """Micro-batches by tokens instead of trajectories (verl's key): longest trajectories
    first, each micro-batch holding at most ppo_max_token_len_per_gpu tokens, padding
    included (a longer trajectory goes alone)."""
    ppo_max_token_len_per_gpu: int = Field(16384, ge=1)
    """The tokens of one micro-batch with use_dynamic_bsz (verl's default)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    fsdp_config: FsdpConfig = Field(default_factory=FsdpConfig)

    @property
    def clip_range(self) -> tuple[float, float]:
        """(below 1, above 1): the clip ranges the loss uses."""
        low, high = self.clip_ratio_low, self.clip_ratio_high
        return (self.clip_ratio if low is None else low, self.clip_ratio if high is None else high)

    @property
    def micro_batching(self) -> tuple[int | None, int | None]:
        """(rows, tokens) per micro-batch, as consumers.grpo.micro_batches takes them."""
        if self.use_dynamic_bsz:
            return None, self.ppo_max_token_len_per_gpu
        return self.ppo_micro_batch_size_per_gpu, None
