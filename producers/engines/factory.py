"""One place that turns ``actor_rollout_ref.rollout.name`` into an engine."""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.config import RunConfig
from asyncrl.producers.engines.base import Engine, StepwiseEngine


def make_engine(
    cfg: RunConfig, model: torch.nn.Module, tokenizer: Any, seed: int, thread: bool = False
) -> Engine:
    """The engine ``rollout.name`` names; ``thread``: served on a thread of its own
    (``background.BackgroundEngine``), else stepped by its caller."""
    engine = _stepwise_engine(cfg, model, tokenizer, seed)
    if thread:
        from asyncrl.producers.engines.background import BackgroundEngine

        return BackgroundEngine(engine)
    return engine


def _stepwise_engine(
    cfg: RunConfig, model: torch.nn.Module, tokenizer: Any, seed: int
) -> StepwiseEngine:
    from asyncrl.models.policy import eos_token_ids

    rollout = cfg.actor_rollout_ref.rollout
    name = engine_name(rollout.name, model)
    if name in HF_ENGINES:
        return hf_engine(
            name,
            model,
            tokenizer,
            temperature=rollout.temperature,
            eos_token_id=eos_token_ids(model, tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            seed=seed,
            emulated_decode_latency_s=rollout.emulated_decode_latency_s,
            cuda_graphs=not rollout.enforce_eager,
        )
    if name == "vllm":
        from asyncrl.producers.engines.vllm_engine import VLLMEngine, VLLMOptions

        return VLLMEngine(
            model,
            tokenizer,
            temperature=rollout.temperature,
            eos_token_id=eos_token_ids(model, tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            seed=seed,
            emulated_decode_latency_s=rollout.emulated_decode_latency_s,
            options=VLLMOptions(
                max_num_seqs=rollout.max_num_seqs,
                max_num_batched_tokens=rollout.max_num_batched_tokens,
                max_model_len=rollout.max_model_len,
                enforce_eager=rollout.enforce_eager,
                enable_prefix_caching=rollout.enable_prefix_caching,
                enable_chunked_prefill=rollout.enable_chunked_prefill,
                gpu_memory_utilization=rollout.gpu_memory_utilization,
            ),
        )
    if rollout.name == "sim":
        from asyncrl.producers.engines.sim import SimEngine

        return SimEngine(
            model,
            cfg.sim,
            vocab_size=len(tokenizer),
            eos_token_id=tokenizer.eos_token_id,
            seed=seed,
        )
    raise ValueError(f"actor_rollout_ref.rollout.name={rollout.name!r} has no engine")


HF_ENGINES = ("hf", "hf_cached", "hf_static")


def engine_name(name: str, model: torch.nn.Module) -> str:
    """``rollout.name`` with ``auto`` resolved for ``model``: hf_static on a GPU (its decoding
    steps replay as CUDA graphs: docs/benchmarks.md), hf_cached on a CPU, where hf_static runs
    the same work eagerly a little slower, and for models with sliding-window layers (which
    hf_static refuses)."""
    if name != "auto":
        return name
    from asyncrl.producers.engines.static import has_sliding_window

    on_gpu = next(model.parameters()).is_cuda
    return "hf_static" if on_gpu and not has_sliding_window(model) else "hf_cached"


def hf_engine(name: str, *args: Any, cuda_graphs: bool = True, **kwargs: Any) -> StepwiseEngine:
    """The transformers engine ``name`` (one of ``HF_ENGINES``), built with the hf engine's
    arguments; ``cuda_graphs`` matters to hf_static alone."""
    if name == "hf_static":
        from asyncrl.producers.engines.static import StaticHFEngine

        return StaticHFEngine(*args, cuda_graphs=cuda_graphs, **kwargs)
    from asyncrl.producers.engines.cached import CachedHFEngine
    from asyncrl.producers.engines.hf import HFEngine

    return (CachedHFEngine if name == "hf_cached" else HFEngine)(*args, **kwargs)
