"""The engine a held-out evaluation generates on: the rollout's kind (``rollout.name``), as verl
validates on its rollout engine, with at most one vLLM engine in a process
(``vllm_engine._LIVE``: vLLM's parallel groups are per process).

- **hf, hf_cached, hf_static, auto, sim**: a transformers engine over the evaluated model,
  built per evaluation (cheap): hf for hf, hf_cached for the others (the sim engine models no
  weights; hf_static's fixed slots buy nothing for one batch of short prompts).
- **vllm, on a rollout worker** (``use_trainer_do_validate=false``: worker 0 after a load),
  greedy: the worker's own running engine (a ``BackgroundEngine``), which holds the weights
  just loaded. The evaluation's requests go in under ids of their own (``held-out/<i>``; a
  rollout request's id ends in ``#<i>``), and only their results are taken
  (``BackgroundEngine.collect``'s ``request_ids``): the rollout's requests still in flight go
  on decoding and their results stay for the worker.
- **vllm, the colocated baseline** (``idle``): its own rollout engine, which holds the current
  weights and has nothing else in flight, lent whole; a sampled evaluation
  (``val_kwargs.do_sample``) sets its temperature/top_p/top_k and seed for the evaluation's
  duration and restores them after.
- **vllm, a process with no rollout engine** (the trainer, a sharded trainer's rank 0): one
  evaluation VLLMEngine per process, built at the first evaluation (vLLM takes ~15 s to start
  on a CPU) and kept; it is *evictable*: an engine launched later in the process closes it
  first (it is rebuilt at the next evaluation). Before each evaluation it loads the evaluated
  model's weights (``update_weights``; it reads them from that very module) and takes the
  evaluation's sampling settings. Its KV cache holds ``EVAL_MAX_SEQS`` sequences of prompt plus
  response length (data.max_prompt_length + data.max_response_length, or
  rollout.max_model_len), sized so on a GPU too (``VLLMOptions.size_kv_to_seqs``), where it
  shares the trainer's device. On a CPU it runs eagerly whatever ``rollout.enforce_eager``
  says: compiling (~50 s on a loaded 2-core machine) would cost more than it saves on a few
  hundred short answers.
- **vllm, anywhere a rollout engine is live and cannot be lent** (a worker's sampled
  evaluation, whose temperature/top_p/top_k and seed differ from the rollout's while a
  VLLMEngine sets them for all its requests; a worker that steps its engine itself,
  ``rollout.engine_thread=false``, whose results the evaluation's steps would take): hf_cached
  over the same weights (the worker's transformers copy), logged once with the reason. A
  second vLLM engine would break the first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from asyncrl.config import RunConfig
from asyncrl.producers.engines.base import Engine, GenRequest, GenResult, generate_all

if TYPE_CHECKING:
    from asyncrl.producers.engines.vllm_engine import VLLMEngine

__all__ = [
    "EVAL_MAX_SEQS",
    "Lent",
    "SharedEngine",
    "eval_engine",
    "evaluation_engine",
    "on_transformers",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

EVAL_MAX_SEQS = 64
"""Sequences the evaluation's own VLLMEngine decodes at once (the rest queue)."""

_VLLM: dict[str, VLLMEngine] = {}
"""The process's evaluation VLLMEngine, under the key "engine" once built."""
_LOGGED: set[str] = set()


def _log_once(what: str) -> None:
    if what not in _LOGGED:
        _LOGGED.add(what)
        log.info("held-out evaluation generates on %s", what)


def eval_engine(name: str) -> type:
    """The transformers engine class a held-out evaluation of a ``rollout.name`` other than
    vllm generates with: hf for hf, else hf_cached."""
    from asyncrl.producers.engines.cached import CachedHFEngine
    from asyncrl.producers.engines.hf import HFEngine

    return HFEngine if name == "hf" else CachedHFEngine


def on_transformers(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a vllm rollout's evaluation moved to hf_cached (the others unchanged): for
    a measurement of a model that is not the rollout's (the warm start's), which need not
    start, nor leave behind, a vLLM engine."""
    if cfg.actor_rollout_ref.rollout.name != "vllm":
        return cfg
    moved = cfg.model_copy(deep=True)
    moved.actor_rollout_ref.rollout.name = "hf_cached"
    return moved


def evaluation_engine(
    cfg: RunConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    running: Engine | None = None,
    greedy: bool = True,
    idle: bool = False,
) -> Engine:
    """The engine an evaluation of ``model`` under ``cfg`` generates on (see the module doc):
    ``running``, a rollout engine holding ``model``'s weights, is shared where it can be;
    ``idle``: ``running`` has nothing else in flight and is lent whole. ``greedy``: every
    request of the evaluation is greedy. Closing what this returns never closes a shared,
    lent or cached engine."""
    from asyncrl.producers.engines.background import BackgroundEngine
    from asyncrl.producers.engines.cached import CachedHFEngine

    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name != "vllm":
        name = eval_engine(rollout.name)
        return _transformers(
            cfg, model, tokenizer, name, f"{name.__name__} (rollout.name={rollout.name})"
        )
    if running is not None and idle:
        _log_once("the loop's own vLLM engine (nothing else in flight)")
        return Lent(running, _sampling(cfg))
    if running is not None:
        if isinstance(running, BackgroundEngine) and greedy:
            _log_once("the rollout worker's own vLLM engine (greedy, beside its rollout)")
            return SharedEngine(running)
        why = (
            "val_kwargs.do_sample: its temperature/top_p/top_k and seed are not the rollout's"
            if not greedy
            else "rollout.engine_thread=false: the worker steps its engine itself"
        )
        return _transformers(cfg, model, tokenizer, CachedHFEngine, f"{_HF_BESIDE} ({why})")
    from asyncrl.producers.engines.vllm_engine import live_engine

    live = live_engine()
    if live is not None and not live.evictable:
        why = "a rollout vLLM engine is live in this process and not lent to the evaluation"
        return _transformers(cfg, model, tokenizer, CachedHFEngine, f"{_HF_BESIDE} ({why})")
    engine = _vllm_engine(cfg, model, tokenizer)
    engine.update_weights(lambda _: None)  # loads model's weights into vLLM's copy
    _log_once(
        f"an evaluation vLLM engine (one per process, {engine.options.max_num_seqs} sequences "
        f"of {engine.options.max_model_len} tokens)"
    )
    return Lent(engine, _sampling(cfg))


_HF_BESIDE = "hf_cached over the same weights, not a second vLLM engine in the process"


def _transformers(
    cfg: RunConfig, model: torch.nn.Module, tokenizer: Any, name: type, what: str
) -> Engine:
    """A fresh transformers engine ``name`` over ``model`` with the evaluation's sampling."""
    from asyncrl.models.policy import eos_token_ids

    _log_once(what)
    temperature, top_p, top_k, seed = _sampling(cfg)
    engine: Engine = name(
        model,
        tokenizer,
        temperature,
        eos_token_ids(model, tokenizer),
        tokenizer.pad_token_id,
        seed=seed,
        top_p=top_p,
        top_k=top_k,
    )
    return engine


def _sampling(cfg: RunConfig) -> tuple[float, float, int, int]:
    """An evaluation's temperature, top_p, top_k and seed (a greedy request ignores them)."""
    rollout = cfg.actor_rollout_ref.rollout
    val = rollout.val_kwargs
    temperature = val.temperature or rollout.temperature
    return float(temperature), val.top_p, val.top_k, cfg.trainer.seed


def _vllm_engine(cfg: RunConfig, model: torch.nn.Module, tokenizer: Any) -> VLLMEngine:
    """The process's evaluation VLLMEngine, pointed at ``model`` (built at the first call; a
    model of another shape than the one it was built for replaces it)."""
    from asyncrl.models.policy import eos_token_ids
    from asyncrl.producers.engines.vllm_engine import VLLMEngine, VLLMOptions

    engine = _VLLM.get("engine")
    if engine is not None and engine.llm is None:  # evicted by a later engine's launch
        engine = None
    if engine is not None and engine.model is not model:
        if _shape(engine.model) == _shape(model):
            engine.model = model  # weights_changed reads this module's parameters
        else:
            engine.close()
            engine = None
    if engine is None:
        rollout, data = cfg.actor_rollout_ref.rollout, cfg.data
        config: Any = model.config
        length = rollout.max_model_len or min(
            data.max_prompt_length + data.max_response_length, config.max_position_embeddings
        )
        engine = _VLLM["engine"] = VLLMEngine(
            model,
            tokenizer,
            temperature=1.0,  # set per evaluation
            eos_token_id=eos_token_ids(model, tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            seed=cfg.trainer.seed,
            options=VLLMOptions(
                max_num_seqs=min(EVAL_MAX_SEQS, rollout.max_num_seqs),
                max_model_len=length,
                # on a CPU, torch.compile's start (~50 s at load) buys nothing for a few
                # hundred short answers: eager, whatever the rollout's engine does
                enforce_eager=rollout.enforce_eager
                or next(model.parameters()).device.type == "cpu",
                enable_prefix_caching=rollout.enable_prefix_caching,
                enable_chunked_prefill=rollout.enable_chunked_prefill,
                gpu_memory_utilization=rollout.gpu_memory_utilization,
                size_kv_to_seqs=True,  # beside the trainer on its device
            ),
            evictable=True,
        )
    return engine


def _shape(model: torch.nn.Module) -> tuple[Any, ...]:
    """What a VLLMEngine's model must keep to take another module's weights."""
    params = tuple((n, p.shape, p.dtype, p.device) for n, p in model.named_parameters())
    return type(model), params


class Lent:
    """An engine lent to one evaluation: it forwards to the engine, and closing it aborts what
    the evaluation left running and keeps the engine (the process's evaluation VLLMEngine, the
    colocated loop's rollout engine). ``sampling``: the evaluation's temperature, top_p, top_k
    and seed, set on the VLLMEngine for the loan and restored after."""

    def __init__(self, engine: Any, sampling: tuple[float, float, int, int] | None = None) -> None:
        from asyncrl.producers.engines.background import BackgroundEngine

        self.engine = engine
        self.model = engine.model
        self._vllm: Any = engine.engine if isinstance(engine, BackgroundEngine) else engine
        self._restore: tuple[float, float, int, int] | None = None
        if sampling is not None:
            self._restore = self._swap(sampling)

    def _swap(self, sampling: tuple[float, float, int, int]) -> tuple[float, float, int, int]:
        e = self._vllm
        before = (e.temperature, e.top_p, e.top_k, e.seed)
        e.temperature, e.top_p, e.top_k, e.seed = sampling
        return before

    @property
    def num_active(self) -> int:
        return int(self.engine.num_active)

    @property
    def full_batch(self) -> int | None:
        return self.engine.full_batch

    def add(self, req: GenRequest) -> None:
        self.engine.add(req)

    def collect(self, timeout: float = 0.0) -> list[GenResult]:
        return self.engine.collect(timeout)

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenResult]:
        return self.engine.abort(request_ids)

    def update_weights(self, apply: Callable[[torch.nn.Module], T]) -> T:
        return self.engine.update_weights(apply)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        return generate_all(self, reqs)

    def prepare(self, rows: int, length: int) -> None:
        """Nothing: the engine was prepared by its owner."""

    def close(self) -> None:
        self.abort()
        if self._restore is not None:
            self._swap(self._restore)
            self._restore = None


class SharedEngine(Lent):
    """A running rollout engine (a ``BackgroundEngine``) seen by an evaluation: its requests
    under ids of their own, its results alone, its requests alone aborted (see the module
    doc). The rollout's requests keep decoding beside it."""

    PREFIX = "held-out/"

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self._mine: set[str] = set()
        """The engine's ids of this evaluation's requests not collected yet."""

    @property
    def num_active(self) -> int:
        return len(self._mine)

    def add(self, req: GenRequest) -> None:
        if "#" in req.request_id:
            raise ValueError(f"{req.request_id}: an evaluation's request id has no '#'")
        rid = self.PREFIX + req.request_id
        self._mine.add(rid)
        self.engine.add(
            GenRequest(
                rid,
                req.prompt_ids,
                req.max_new_tokens,
                req.prefix_ids,
                req.prefix_logprobs,
                req.greedy,
                req.stop_token_ids,
            )
        )

    def _own(self, results: list[GenResult]) -> list[GenResult]:
        for res in results:
            self._mine.discard(res.request_id)
            res.request_id = res.request_id.removeprefix(self.PREFIX)
        return results

    def collect(self, timeout: float = 0.0) -> list[GenResult]:
        return self._own(self.engine.collect(timeout, request_ids=self._mine))

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenResult]:
        ids = (
            set(self._mine)
            if request_ids is None
            else {self.PREFIX + r for r in request_ids} & self._mine
        )
        return self._own(self.engine.abort(ids)) if ids else []

    def update_weights(self, apply: Callable[[torch.nn.Module], T]) -> T:
        raise RuntimeError("an evaluation does not change the rollout engine's weights")
