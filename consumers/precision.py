"""The precision the trainer computes in (``actor_rollout_ref.actor.fsdp_config.dtype``).

Mixed precision as verl's FSDP actor runs it: the weights, their gradients and AdamW's state
stay float32 (``model_dtype: fp32``), the forward passes compute in bfloat16 under autocast, and
the backward follows the forward's dtypes. On a GPU that is the difference between float32
matmuls and tensor-core bf16 ones; log-softmax stays float32 under autocast (and
:func:`asyncrl.consumers.grpo.token_logprobs` takes it on float32 logits anyway).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

from asyncrl.config import RunConfig
from asyncrl.models.policy import resolve_dtype


def compute_dtype(cfg: RunConfig, device: torch.device) -> torch.dtype:
    """``fsdp_config.dtype`` resolved for a trainer on ``device``: auto is bfloat16 on a GPU,
    float32 on the CPU."""
    return resolve_dtype(cfg.actor_rollout_ref.actor.fsdp_config.dtype, device)


def autocast(cfg: RunConfig, model: torch.nn.Module) -> AbstractContextManager:
    """Where the trainer's forward passes (and their losses) run: autocast to the compute
    dtype, or nothing in float32. Backward passes run outside it (torch's advice)."""
    device = next(model.parameters()).device
    dtype = compute_dtype(cfg, device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
