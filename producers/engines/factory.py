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
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name in ("hf", "hf_cached", "hf_static"):
        args = (model, tokenizer)
        kwargs: dict[str, Any] = dict(
            temperature=rollout.temperature,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            seed=seed,
            emulated_decode_latency_s=rollout.emulated_decode_latency_s,
        )
        if rollout.name == "hf_static":
            from asyncrl.producers.engines.static import StaticHFEngine

            return StaticHFEngine(*args, cuda_graphs=not rollout.enforce_eager, **kwargs)
        from asyncrl.producers.engines.cached import CachedHFEngine
        from asyncrl.producers.engines.hf import HFEngine

        engine = CachedHFEngine if rollout.name == "hf_cached" else HFEngine
        return engine(*args, **kwargs)
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
