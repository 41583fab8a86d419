"""verl's vLLM keys under ``actor_rollout_ref.rollout``: what the ``vllm`` engine is built with.

They are fields of the rollout section (:class:`asyncrl.config.rollout.RolloutConfig`
inherits them; in config/rollout.py), under verl's names and defaults, kept here in one place. Only
``rollout.name=vllm`` reads them; the hf engines schedule their own way and do not. The keys
verl shares with the hf engines (``dtype``, ``enforce_eager``) stay in the rollout section.
"""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import Strict


class VLLMKeys(Strict):
    """verl's vLLM engine keys (see the module doc)."""

    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """verl's key. On a GPU: the share of its memory vLLM takes (weights, activations, KV
    cache). On a CPU vLLM would read it as a share of all RAM; the vllm engine instead sizes
    its KV cache to hold max_num_seqs sequences of max_model_len tokens (64 MiB to 2 GiB)."""
    max_num_seqs: int = Field(1024, ge=1, le=65536)
    """verl's key: requests vLLM decodes at once (more wait for a free slot)."""
    max_num_batched_tokens: int | None = Field(8192, ge=1)
    """verl's key: tokens (prefill and decode) one vLLM step schedules at most; None: vLLM's
    default."""
    max_model_len: int | None = Field(None, ge=1)
    """verl's key: the longest prompt plus response vLLM serves; None: the model's
    max_position_embeddings."""
    enable_prefix_caching: bool = True
    """verl's key: vLLM reuses the KV blocks of a prompt it has seen (a group's n
    trajectories share one prompt). Reset at every weight load."""
    enable_chunked_prefill: bool = True
    """verl's key: vLLM splits long prefills across steps, beside decoding requests."""
