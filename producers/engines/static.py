"""The ``hf_static`` engine: hf_cached's tokens from a KV cache of fixed slots, so that every
decoding step has the same shapes and a GPU replays it as a CUDA graph.

Why: hf_cached grows its cache by concatenation and launches each of the model's kernels from
Python at every token. On a GPU a small model's decoding step is then bound by the host, not
the device (transformers' eager ``generate`` makes 1.2K tokens/s at batch 64 on an H100, its
static cache compiled 24K). The layout here is vLLM's and SGLang's idea in
miniature: preallocated cache rows, a fixed-shape step per batch size, captured once.

1. Each layer's keys and values live in one tensor ``[slots, kv heads, max_len, head dim]``.
   Active requests hold rows ``0..n-1``; row ``r`` has ``lens[r]`` tokens cached, in columns
   ``0..lens[r]-1``. A request that leaves gives its row to one of the last rows (its keys and
   values are copied down), so the active rows stay a prefix.
2. A request joins by one batched prefill over the joining contexts minus their last token,
   right-padded so that each row's tokens land in its first columns; the layers' keys and
   values are copied into the rows. Rows and ``max_len`` grow (by reallocation) when a request
   needs more.
3. A decoding step feeds row ``r`` its last token at position ``lens[r]``, writes that token's
   key and value at column ``lens[r]`` and attends to columns ``<= lens[r]``: a mask made from
   the positions inside the step, no host synchronisation. On CUDA the step over the first
   ``b`` rows (``b`` the smallest power of two >= n; the rows past n are free and fed padding)
   is captured as a CUDA graph the first time ``b`` is needed and replayed after that
   (``actor_rollout_ref.rollout.enforce_eager`` turns that off). On a CPU it runs eagerly on
   exactly the active rows.
4. The next token is chosen from the logits exactly as the hf engine chooses it, the rows taken
   in the order they joined (hf_cached's row order: the same seed draws the same tokens).

Positions count real tokens and masked columns weigh nothing, so a row's logits are hf_cached's
up to float rounding, and the recorded logprobs what the trainer recomputes. New weights are
copied into the same tensors (the graphs keep reading them), and invalidate the cache: every
request is prefilled again at the next step. Models whose layers use sliding-window attention
are refused (the one mask here is the full one): use hf_cached for them.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from asyncrl.producers.engines.attention import grouped_decoding
from asyncrl.producers.engines.base import ActiveRequest, GenResult
from asyncrl.producers.engines.cached import newcomers, tensors
from asyncrl.producers.engines.hf import HFEngine

LEN_ALIGN = 64
"""``max_len`` grows in multiples of this many columns."""
MIN_SLOTS = 8


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def has_sliding_window(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s layers uses sliding-window attention (this engine's one mask
    is the full one, so it refuses such models)."""
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or []
    return any("sliding" in t for t in layer_types)


class SlotWrites:
    """The ``past_key_values`` of a decoding step: each attention layer hands it the step's key
    and value of every row, which go to column ``cols[r]`` of row ``r``; the layer gets the
    rows' whole buffers back (the mask hides the columns a row has not filled)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], cols: torch.Tensor):
        self.keys, self.values, self.cols = keys, values, cols
        self.rows = torch.arange(len(cols), device=cols.device)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self.rows, :, self.cols] = key_states[:, :, 0]
        values[self.rows, :, self.cols] = value_states[:, :, 0]
        return keys, values


class StaticHFEngine(HFEngine):
    """The hf engine over a slotted KV cache, its decoding steps CUDA graphs on a GPU (see
    the module doc)."""

    def __init__(self, *args: Any, cuda_graphs: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if has_sliding_window(self.model):
            raise ValueError(
                "actor_rollout_ref.rollout.name=hf_static: the model has sliding-window "
                "attention layers, which this engine does not mask; use hf_cached"
            )
        self.cuda_graphs = cuda_graphs
        self._rows: list[ActiveRequest] = []
        self._lens: list[int] = []
        self._joined: list[int] = []
        """Each row's join number: tokens are drawn in join order, hf_cached's row order, so
        that both engines sample the same tokens from the same seed."""
        self._joins = 0
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._ids = torch.zeros((0, 1), dtype=torch.long)
        """Each row's next input token, ``[slots, 1]``; ``_pos`` its position (= ``lens``)."""
        self._pos = torch.zeros((0, 1), dtype=torch.long)
        self._columns = torch.arange(0)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: Any = None

    # --- buffers ---------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self._ids.shape[0]

    @property
    def max_len(self) -> int:
        return self._columns.shape[0]

    def _reserve(self, rows: int, length: int) -> None:
        """Make room for ``rows`` rows of ``length`` columns, keeping what is cached."""
        if rows <= self.slots and length <= self.max_len:
            return
        slots = max(self.slots, _pow2(max(rows, MIN_SLOTS)))
        width = max(self.max_len, -(-length // LEN_ALIGN) * LEN_ALIGN)
        param = next(self.model.parameters())
        config: Any = self.model.config
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
            config.num_attention_heads
        )
        shape = (slots, heads, width, head_dim)
        old = list(zip(self._keys, self._values, strict=True))
        self._keys, self._values = [], []
        for i in range(config.num_hidden_layers):
            k, v = (torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in "kv")
            if old:
                k_old, v_old = old[i]
                k[: k_old.shape[0], :, : k_old.shape[2]] = k_old
                v[: v_old.shape[0], :, : v_old.shape[2]] = v_old
            self._keys.append(k)
            self._values.append(v)
        self._ids = torch.full((slots, 1), self.pad_token_id, dtype=torch.long, device=param.device)
        self._pos = torch.zeros((slots, 1), dtype=torch.long, device=param.device)
        self._columns = torch.arange(width, device=param.device)
        # The graphs read the old buffers; with the last graph goes their memory pool, which
        # a capture must not name again (PyTorch asserts on a pool no graph holds).
        self._graphs.clear()
        self._pool = None

    def weights_changed(self) -> None:
        self._rows, self._lens, self._joined = [], [], []

    def prepare(self, rows: int, length: int) -> None:
        """Reserve ``rows`` slots of ``length`` columns now, and on a GPU capture the step of
        every bucket up to them: otherwise the first requests grow the cache bucket by bucket
        (8, 16, 32 ... rows), each growth dropping every graph captured so far, and capture
        again under load. The free rows the captures step are unread (``_graph``)."""
        if self._rows:
            return  # a hint for an idle engine; a busy one has grown as it needed
        self._reserve(rows, length)
        if not (self.cuda_graphs and self._ids.is_cuda):
            return
        b = 1
        while b <= self.slots:
            self._graph(b)
            b *= 2

    # --- a step (module doc, 1-4) -----------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[GenResult]:
        finished = self._take_complete()
        self._drop_left()
        if not self._active:
            return finished
        joining = newcomers(self._active.values(), self._rows)
        if joining:
            self._join(joining)
        n = len(self._rows)
        last = [a.ids[-1] if a.ids else a.req.prompt_ids[-1] for a in self._rows]
        device = self._ids.device
        self._ids[:n, 0] = torch.tensor(last, device=device)
        self._pos[:n, 0] = torch.tensor(self._lens, device=device)
        logits = self._decode_step(n)
        self._lens = [x + 1 for x in self._lens]
        order = sorted(range(n), key=self._joined.__getitem__)
        index = torch.tensor(order, device=device)
        return finished + self._choose([self._rows[r] for r in order], logits[index])

    def _drop_left(self) -> None:
        """Step 1: rows whose request left are freed; the last rows move into the holes."""
        keep = [i for i, a in enumerate(self._rows) if self._active.get(a.req.request_id) is a]
        if len(keep) == len(self._rows):
            return
        m = len(keep)
        kept = set(keep)
        holes = [i for i in range(m) if i not in kept]
        movers = [i for i in keep if i >= m]
        if holes:
            dst = torch.tensor(holes, device=self._ids.device)
            src = torch.tensor(movers, device=self._ids.device)
            for buf in (*self._keys, *self._values):
                buf[dst] = buf[src]
            for h, s in zip(holes, movers, strict=True):
                self._rows[h], self._lens[h] = self._rows[s], self._lens[s]
                self._joined[h] = self._joined[s]
        self._rows, self._lens, self._joined = self._rows[:m], self._lens[:m], self._joined[:m]

    def _join(self, joining: list[ActiveRequest]) -> None:
        """Step 2: prefill the joining contexts (minus their last token) into new rows."""
        contexts = [(a.req.prompt_ids + a.ids)[:-1] for a in joining]
        need = max(len(a.req.prompt_ids) + a.req.max_new_tokens for a in joining)
        start = len(self._rows)
        self._reserve(start + len(joining), need)
        self._rows += joining
        self._lens += [len(c) for c in contexts]
        self._joined += range(self._joins, self._joins + len(joining))
        self._joins += len(joining)
        # One-token prompts have nothing to cache (and a row of padding alone would attend to
        # nothing): they stay out of the prefill.
        rows = [start + i for i, c in enumerate(contexts) if c]
        contexts = [c for c in contexts if c]
        if not contexts:
            return
        width = max(len(c) for c in contexts)
        device = self._ids.device
        ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, : len(c)] = 1
        cache = DynamicCache()
        self.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=torch.arange(width, device=device).expand(len(contexts), width),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        dst = torch.tensor(rows, device=device)
        for i, (k, v) in enumerate(tensors(cache)):
            self._keys[i][dst, :, :width] = k
            self._values[i][dst, :, :width] = v

    def _decode_step(self, n: int) -> torch.Tensor:
        """Step 3: logits ``[>= n, vocab]`` of the next token of rows ``0..n-1``."""
        if not (self.cuda_graphs and self._ids.is_cuda):
            return self.decode(n)
        graph, logits = self._graph(min(_pow2(n), self.slots), n)
        graph.replay()
        return logits

    def _graph(self, b: int, n: int = 0) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The graph of the ``b``-row bucket (captured on first use), with rows ``n..b-1``
        (free: no request in them) made harmless for it to step."""
        self._ids[n:b] = self.pad_token_id  # free rows: column 0 of their own row, unread
        self._pos[n:b] = 0
        if b not in self._graphs:
            self._graphs[b] = self._capture(b)
        return self._graphs[b]

    def decode(self, b: int) -> torch.Tensor:
        """The step over rows ``0..b-1`` from the ``_ids``/``_pos`` buffers: fixed shapes, no
        host synchronisation (what a CUDA graph can hold)."""
        pos = self._pos[:b]
        mask = self._columns[None, None, None, :] <= pos[:, :, None, None]  # [b, 1, 1, len]
        writes = SlotWrites([k[:b] for k in self._keys], [v[:b] for v in self._values], pos.view(b))
        with grouped_decoding(self.model):
            out = self.model(
                input_ids=self._ids[:b],
                attention_mask=mask,
                position_ids=pos,
                past_key_values=writes,
                use_cache=True,
            )
        return out.logits[:, -1, :]

    def _capture(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The step over ``b`` rows as a CUDA graph, and the tensor its replays write the
        logits to. The warm-up run writes what the replay will (this step's column of each
        row), so it changes nothing."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.decode(b)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.decode(b)
        self._pool = graph.pool()
        return graph, logits
