"""Attention for decoding steps (one query token a row) that reads each key/value head once.

Why: a decoding step over a batch always carries an attention mask (rows of different
lengths), and with a mask transformers' ``sdpa`` path copies every key/value head once per
query head it serves (``repeat_kv``) before calling the kernel: 7 copies of the whole KV cache
per layer and step for Qwen2-0.5B (14 query heads, 2 key/value heads). That copy, not the
weights, bounded the engines' decoding on an H100 (bench engine: 17 ms a step at batch 256)
and on the CPU (36 ms a layer at batch 64, 320 columns; 1.1 ms read once). Here the query
heads of each group attend together as one matrix against their shared key/value head.

Scores and the softmax are float32 (what SDPA's kernels accumulate in), so bf16 models keep
their logprobs within the noise the trainer's recomputation allows. On a GPU in bf16/fp16 the
scores come from the cache as it is (a GEMM writing float32) and the probabilities meet the
values in the cache's dtype, as in flash attention, so no float32 copy of the cache is made
(on an H100, hf_static's step at 0.5B, batch 256 takes 7.2 ms this way, 17 ms with the
copies); on the CPU it casts. Everything else (prefill, training passes, sliding windows, soft
caps, sinks, models without grouped heads) goes to transformers' own ``sdpa`` function
unchanged. Engines switch a model to it only around their decoding forward pass
(:func:`grouped_decoding`), so a model shared with the trainer (the colocated baseline) trains
exactly as it would without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "asyncrl_grouped_decode"
UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "position_bias")
"""Attention kwargs this function leaves to sdpa when they are set."""


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query [b, heads, q, d]``, ``key``/``value``
    ``[b, kv heads, L, d]``; returns ``[b, q, heads, d]``."""
    batch, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    mask = attention_mask
    if (
        q_len != 1
        or groups == 1
        or dropout
        or any(kwargs.get(k) is not None for k in UNSUPPORTED)
        or (mask is not None and mask.shape[1] != 1)
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = dim**-0.5 if scaling is None else scaling
    scores = _scores(query, key, scale)  # float32 [b, kv heads, groups, L]
    if mask is not None:
        mask = mask[:, :, -1:, :length]  # [b, 1, 1, L]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1)
    if _half_on_gpu(value):  # probabilities in the cache's dtype, as flash attention's kernels
        out = torch.matmul(probs.to(value.dtype), value)  # accumulated in float32 by cuBLAS
    else:
        out = torch.matmul(probs, value.float()).to(query.dtype)  # [b, kv heads, groups, d]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


_FLOAT32_OUT = {"ok": True}
"""Whether this torch has ``bmm(..., out_dtype=float32)`` for half-precision CUDA inputs
(aten's ``bmm.dtype``); set False by the first call that refuses it."""


def _half_on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16) and _FLOAT32_OUT["ok"]


def _scores(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """``query @ key^T * scale`` per group of query heads, in float32 ``[b, kv, groups, L]``.

    On a GPU in bf16/fp16, one batched GEMM reads the cache as it is and writes float32
    scores (``bmm``'s ``out_dtype``): casting the keys to float32 first would write and read
    the whole cache again at every layer and step (~2 GB a step at 0.5B, batch 256, 320
    columns). Elsewhere (a CPU, a torch without it) the keys are cast."""
    batch, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    if _half_on_gpu(key):
        q = query.reshape(batch * kv_heads, groups, dim)
        k = key.reshape(batch * kv_heads, length, dim)
        try:
            scores = torch.bmm(q, k.transpose(1, 2), out_dtype=torch.float32)
            return scores.view(batch, kv_heads, groups, length) * scale
        except (TypeError, RuntimeError, NotImplementedError):
            _FLOAT32_OUT["ok"] = False
    q = query.reshape(batch, kv_heads, groups, dim).float() * scale
    return torch.matmul(q, key.float().transpose(-1, -2))


AttentionInterface.register(NAME, grouped_decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def grouped_decoding(model: torch.nn.Module) -> Iterator[None]:
    """Run the forward passes inside on :func:`grouped_decode_attention` if the model uses
    sdpa (an eager or flash-attention model is left as it is); restored on the way out."""
    config: Any = model.config
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
