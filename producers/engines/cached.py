"""The ``hf_cached`` engine: the hf engine's sampling over a KV cache, with continuous batching.

Why: the hf engine recomputes every whole sequence at every token, so a response of R tokens
costs ~R^2/2 token-forwards; with a cache it costs R (plus one prefill of the prompt).

One transformers ``DynamicCache`` holds every active sequence, left-padded to one width, all
rows ending at the current step. Requests join and leave between steps:

1. Rows whose request left (finished, aborted, or re-added as a new request under the same id)
   are dropped, and the padding columns no remaining row needs are cut.
2. Requests without a row (new ones, continuations, or all of them after ``weights_changed``)
   are prefilled in one batched forward over their context minus its last token (prompt plus
   prefix), each distinct context once (a sample's ``n`` trajectories join with one prompt)
   and its rows copied to every request that has it, and their rows merged into the cache
   (the narrower side padded on the left).
3. One forward feeds every row its last token and appends it to the cache; the next token is
   chosen from its logits exactly as the hf engine chooses it.

Positions count real tokens only and the attention mask hides padding, so a sequence's logits
do not depend on what it is batched with (to float rounding), and the recorded logprobs are
what :func:`asyncrl.consumers.grpo.token_logprobs` recomputes. The cache is a function of the
weights: ``weights_changed()`` drops it, and the next step prefills every request again.

It takes a model whose forward accepts ``past_key_values`` and ``logits_to_keep`` (transformers'
causal LMs) and reaches into ``DynamicCache.layers`` to select, cut and merge rows (tested with
transformers 5.17).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import DynamicCache

from asyncrl.producers.engines.attention import grouped_decoding
from asyncrl.producers.engines.base import ActiveRequest, GenResult
from asyncrl.producers.engines.hf import HFEngine, left_pad

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Each layer's (keys, values), ``[rows, kv heads, cached columns, head dim]``."""


def pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` with zeros prepended along ``dim`` up to ``width``."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def tensors(cache: DynamicCache) -> KV:
    """The cache's tensors (every layer of a ``DynamicCache()`` is a ``DynamicLayer``)."""
    layers: list[Any] = cache.layers
    return [(layer.keys, layer.values) for layer in layers]


def replace(cache: DynamicCache, kv: KV) -> None:
    """Put ``kv`` in the cache, layer by layer (rows selected, columns cut, rows merged)."""
    layers: list[Any] = cache.layers
    for layer, (keys, values) in zip(layers, kv, strict=True):
        layer.keys, layer.values = keys, values


def keep_rows(t: torch.Tensor, index: torch.Tensor, start: int, dim: int) -> torch.Tensor:
    """Rows ``index`` of ``t`` from column ``start`` on (along ``dim``), as one contiguous copy.

    ``index_select`` after a slice, not ``t[index, :, start:]``: advanced indexing costs ~4x
    as much on the CPU (93 us against 23 for one of the demo's cache tensors, one thread), and
    a step that drops rows runs it for the keys and values of every layer."""
    return t.narrow(dim, start, t.shape[dim] - start).index_select(0, index)


def shared_contexts(contexts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct ``contexts`` and, for each context, the index of its distinct one.

    Why: the ``rollout.n`` trajectories of a sample join together with one prompt, so a
    prefill of each distinct context, its cache rows then copied, computes ``n`` times fewer
    token-forwards than one row per request (a prefill per row would be ~30% of the demo
    worker's engine thread's CPU)."""
    first: dict[tuple[int, ...], int] = {}
    row_of = [first.setdefault(tuple(c), len(first)) for c in contexts]
    distinct = [list(c) for c in first]
    return distinct, row_of


def newcomers(active: Iterable[ActiveRequest], rows: list[ActiveRequest]) -> list[ActiveRequest]:
    """The active requests with no cache row: new ones, continuations, all after new weights
    (a row is its request's object, not its id: an id may be re-added)."""
    held = {id(a) for a in rows}
    return [a for a in active if id(a) not in held]


class CachedHFEngine(HFEngine):
    """The hf engine with a KV cache over the batch (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cache: DynamicCache | None = None
        self._rows: list[ActiveRequest] = []
        """The request of each cache row (the object, not its id: an id may be re-added)."""
        self._mask = torch.zeros((0, 0), dtype=torch.long)
        """``[rows, cached columns]``: 1 where a column holds one of the row's real tokens."""

    def weights_changed(self) -> None:
        self._cache, self._rows, self._mask = None, [], self._mask[:0, :0]

    @torch.no_grad()
    def step(self) -> list[GenResult]:
        finished = self._take_complete()
        self._drop_left()
        if not self._active:
            return finished
        device = next(self.model.parameters()).device
        joining = newcomers(self._active.values(), self._rows)
        if joining:
            self._join(joining, device)
        last = [a.ids[-1] if a.ids else a.req.prompt_ids[-1] for a in self._rows]
        mask = torch.cat([self._mask, self._mask.new_ones((len(last), 1))], dim=1)
        with grouped_decoding(self.model):
            out = self.model(
                input_ids=torch.tensor(last, device=device)[:, None],
                attention_mask=mask,
                position_ids=self._mask.sum(-1, keepdim=True),
                past_key_values=self._cache if self._cache is not None else DynamicCache(),
                use_cache=True,
            )
        self._cache, self._mask = out.past_key_values, mask
        return finished + self._choose(list(self._rows), out.logits[:, -1, :])

    def _drop_left(self) -> None:
        """Step 1 of the module doc."""
        keep = [i for i, a in enumerate(self._rows) if self._active.get(a.req.request_id) is a]
        if len(keep) == len(self._rows):
            return
        if not keep:
            self.weights_changed()  # nothing left to keep
            return
        index = torch.tensor(keep, device=self._mask.device)
        self._rows = [self._rows[i] for i in keep]
        mask = self._mask.index_select(0, index)
        used = mask.any(0).nonzero()
        start = int(used[0]) if len(used) else mask.shape[1]
        self._mask = mask[:, start:]
        if self._cache is not None:
            kv = tensors(self._cache)
            replace(
                self._cache,
                [(keep_rows(k, index, start, 2), keep_rows(v, index, start, 2)) for k, v in kv],
            )

    def _join(self, joining: list[ActiveRequest], device: torch.device) -> None:
        """Step 2 of the module doc."""
        contexts = [(a.req.prompt_ids + a.ids)[:-1] for a in joining]
        mask = torch.zeros((len(joining), 0), dtype=torch.long, device=device)
        new: DynamicCache | None = None
        if any(contexts):
            distinct, row_of = shared_contexts(contexts)
            ids, mask, pos = left_pad(distinct, self.pad_token_id, device)
            new = DynamicCache()
            self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=new,
                use_cache=True,
                logits_to_keep=1,
            )
            if len(distinct) < len(contexts):  # each context's row, copied for each request
                index = torch.tensor(row_of, device=device)
                mask = mask.index_select(0, index)
                replace(
                    new,
                    [(k.index_select(0, index), v.index_select(0, index)) for k, v in tensors(new)],
                )
        self._rows += joining
        width = max(self._mask.shape[1], mask.shape[1])
        merged = [pad_left(self._mask.to(device), width, 1), pad_left(mask, width, 1)]
        self._mask = torch.cat(merged)
        if self._cache is None:  # no rows before these (a step always leaves a cache)
            self._cache = new
            return
        old = tensors(self._cache)
        if new is None:  # prompts of one token, nothing prefilled: rows of padding only
            n = len(joining)
            joined = [
                (k.new_zeros((n, *k.shape[1:])), v.new_zeros((n, *v.shape[1:]))) for k, v in old
            ]
        else:
            joined = tensors(new)
        replace(
            self._cache,
            [
                (
                    torch.cat([pad_left(k, width, 2), pad_left(k_new, width, 2)]),
                    torch.cat([pad_left(v, width, 2), pad_left(v_new, width, 2)]),
                )
                for (k, v), (k_new, v_new) in zip(old, joined, strict=True)
            ],
        )
