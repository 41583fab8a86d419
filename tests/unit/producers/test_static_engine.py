"""hf_static: hf_cached's tokens and logprobs from a cache of fixed slots, through rows that
join, leave and grow, with a decoding step a CUDA graph can hold. (The contract the hf engines
share is tested in test_hf_engine.py, random join/abort/load scripts in test_cached_engine.py,
both parametrized over the engines.)"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from asyncrl.config import ModelConfig, load_config
from asyncrl.consumers.grpo import rollout_logprob_errors
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.models.warm_start import load_policy
from asyncrl.producers.engines.base import GenRequest, GenResult
from asyncrl.producers.engines.cached import CachedHFEngine
from asyncrl.producers.engines.factory import engine_name, make_engine
from asyncrl.producers.engines.static import StaticHFEngine
from asyncrl.tasks.arithmetic import make_problem

TOLERANCE = 1e-4
"""What test_hf_engine.py allows between a recorded logprob and its recomputation."""
SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::item"}
"""Ops that make a GPU wait for the host to read a value: none may be in a captured step."""


@pytest.fixture(scope="module")
def policy():
    """The demo policy after a 100-step warm start (cached, as test_cached_engine's)."""
    return load_policy(load_config(overrides=["actor_rollout_ref.model.warmup_steps=100"]))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok(make_problem(7 * i % 100, 13 * i % 100).prompt)["input_ids"] for i in range(n)]


def _errors(model, results: list[GenResult]) -> torch.Tensor:
    rows = [(r.prompt_ids, r.response_ids, r.response_logprobs, 0.0) for r in results]
    return rollout_logprob_errors(model, rows, pad_token_id=0, temperature=1.0)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_tokens_are_hf_cacheds_and_logprobs_the_trainers(policy, greedy):
    """Sampled too: tokens are drawn in join order, hf_cached's row order, from the same seed."""
    model, tok = policy
    reqs = [
        GenRequest(str(i), p, 2 + i % 3, greedy=greedy) for i, p in enumerate(_prompts(tok, 64))
    ]
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    cached = CachedHFEngine(*args, seed=3).generate(reqs)
    static = StaticHFEngine(*args, seed=3).generate(reqs)
    assert [(r.response_ids, r.finish_reason) for r in static] == [
        (r.response_ids, r.finish_reason) for r in cached
    ]
    assert float(_errors(model, static).max()) < TOLERANCE


def test_rows_and_columns_grow_keeping_what_is_cached(tok):
    """More requests than slots, then one longer than the cache: the buffers are reallocated
    mid-generation and every request still gets the tokens it gets alone."""
    model = build_model(ModelConfig(), len(tok), 0)
    args = (model, tok, 1.0, -1, tok.pad_token_id)  # no EOS: each runs to its budget
    prompts = _prompts(tok, 12)
    reqs = [GenRequest(f"r{i}", p, 4, greedy=True) for i, p in enumerate(prompts[:6])]
    later = [GenRequest(f"s{i}", p, 4, greedy=True) for i, p in enumerate(prompts[6:])]
    long = GenRequest("long", prompts[0] * 4, 90, greedy=True)
    engine = StaticHFEngine(*args)
    done: dict[str, GenResult] = {}
    for req in reqs:
        engine.add(req)
    done.update((r.request_id, r) for r in engine.step())
    slots, width = engine.slots, engine.max_len
    for req in later:  # 12 rows > 8 slots
        engine.add(req)
    done.update((r.request_id, r) for r in engine.step())
    assert engine.slots > slots
    engine.add(long)  # 28 + 90 columns > 64
    done.update((r.request_id, r) for r in engine.step())
    assert engine.max_len > width
    while engine.num_active:
        done.update((r.request_id, r) for r in engine.step())
    for req in [*reqs, *later, long]:
        [alone] = CachedHFEngine(*args).generate([req])
        assert done[req.request_id].response_ids == alone.response_ids
        assert done[req.request_id].response_logprobs == pytest.approx(
            alone.response_logprobs, abs=1e-5
        )


class _Ops(TorchDispatchMode):
    """Records the name of every aten op run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name())
        return func(*args, **(kwargs or {}))


def test_a_decoding_step_never_waits_for_the_host(tok):
    """What a CUDA graph needs of the step: no op that reads a value back (the recorder does
    see them: the control below)."""
    engine = StaticHFEngine(build_model(ModelConfig(), len(tok), 0), tok, 1.0, -1, 0)
    for i, p in enumerate(_prompts(tok, 5)):
        engine.add(GenRequest(str(i), p, 6))
    engine.step()
    engine.step()  # rows are mid-sequence, at different lengths
    with _Ops() as step:
        engine.decode(5)
    assert "aten::index_put_" in step.names  # it did write the cache
    assert not step.names & SYNCING
    with _Ops() as control:
        torch.tensor([1.0]).item()
        torch.tensor([1, 0]).nonzero()
    assert control.names >= {"aten::_local_scalar_dense", "aten::nonzero"}


def test_sliding_window_models_are_refused(tok):
    model = build_model(ModelConfig(), len(tok), 0)
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    with pytest.raises(ValueError, match="sliding-window.*hf_cached"):
        StaticHFEngine(model, tok, 1.0, -1, 0)


def test_the_factory_makes_hf_static_and_enforce_eager_turns_graphs_off(tok):
    model = build_model(ModelConfig(), len(tok), 0)
    for eager in (False, True):
        cfg = load_config(
            overrides=[
                "actor_rollout_ref.rollout.name=hf_static",
                f"actor_rollout_ref.rollout.enforce_eager={str(eager).lower()}",
            ]
        )
        engine = make_engine(cfg, model, tok, seed=0)
        assert isinstance(engine, StaticHFEngine)
        assert engine.cuda_graphs is not eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_graphs_replay_hf_cacheds_tokens(tok):
    """Replayed CUDA graphs, buckets of 8 to 64 rows as requests finish: hf_cached's greedy
    tokens, and logprobs the trainer's recomputation agrees with (float32)."""
    model = build_model(ModelConfig(), len(tok), 0).cuda()
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    reqs = [GenRequest(str(i), p, 2 + i % 7, greedy=True) for i, p in enumerate(_prompts(tok, 64))]
    cached = CachedHFEngine(*args).generate(reqs)
    engine = StaticHFEngine(*args)
    static = engine.generate(reqs)
    assert len(engine._graphs) >= 2  # noqa: SLF001 - several buckets were captured
    assert [r.response_ids for r in static] == [r.response_ids for r in cached]
    assert float(_errors(model, static).max()) < TOLERANCE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_growing_the_cache_after_a_capture_captures_again(tok):
    """Short requests first (graphs captured over small buffers), then longer ones that make
    the buffers grow and drop those graphs: the new capture must not name the dropped graphs'
    memory pool (on an H100, PyTorch's internal assert in capture_begin; bench engine's warm-up
    did exactly this)."""
    model = build_model(ModelConfig(), len(tok), 0).cuda()
    args = (model, tok, 1.0, -1, tok.pad_token_id)
    engine = StaticHFEngine(*args)
    prompts = _prompts(tok, 16)
    engine.generate([GenRequest(f"s{i}", p, 2, greedy=True) for i, p in enumerate(prompts)])
    width = engine.max_len
    reqs = [GenRequest(f"l{i}", p, width + 8, greedy=True) for i, p in enumerate(prompts)]
    grown = engine.generate(reqs)
    assert engine.max_len > width and engine._graphs  # noqa: SLF001 - captured after growing
    cached = CachedHFEngine(*args).generate(reqs)
    assert [r.response_ids for r in grown] == [r.response_ids for r in cached]


def _in_samples(engine: StaticHFEngine, reqs: list[GenRequest]) -> dict[str, list[int]]:
    """Requests arriving 8 at a time (a sample's), a decoding step between: the responses."""
    done: dict[str, list[int]] = {}
    for i in range(0, len(reqs), 8):
        for req in reqs[i : i + 8]:
            engine.add(req)
        done |= {r.request_id: r.response_ids for r in engine.step()}
    while engine.num_active:
        done |= {r.request_id: r.response_ids for r in engine.collect()}
    return done


def test_a_prepared_engine_holds_its_requests_without_growing_and_draws_the_same_tokens(tok):
    """prepare(rows, length) before the first request (what a worker does at start-up):
    requests within it never grow the cache (on a GPU each growth dropped every graph and the
    first samples captured them again), and the tokens are those of an unprepared engine."""
    model = build_model(ModelConfig(), len(tok), 0)
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    prompts = _prompts(tok, 24)
    reqs = [GenRequest(str(i), p, 2 + i % 5, greedy=False) for i, p in enumerate(prompts)]
    length = max(len(p) for p in prompts) + 6
    prepared = StaticHFEngine(*args, seed=5)
    prepared.prepare(24, length)
    assert prepared.slots == 32 and prepared.max_len >= length
    keys = prepared._keys[0]  # noqa: SLF001 - the buffer a growth would replace
    tokens = _in_samples(prepared, reqs)
    assert prepared._keys[0] is keys  # noqa: SLF001 - never reallocated
    unprepared = StaticHFEngine(*args, seed=5)
    assert _in_samples(unprepared, reqs) == tokens and len(tokens) == 24
    assert unprepared._keys[0] is not keys  # noqa: SLF001


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_prepare_captures_every_bucket_before_the_first_request(tok):
    """A worker prepares its engine at start-up: every bucket's graph is captured then, on
    the engine's own thread, and the requests replay them to hf_cached's tokens."""
    from asyncrl.producers.engines.background import BackgroundEngine

    model = build_model(ModelConfig(), len(tok), 0).cuda()
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    prompts = _prompts(tok, 24)
    reqs = [GenRequest(str(i), p, 2 + i % 5, greedy=True) for i, p in enumerate(prompts)]
    static = StaticHFEngine(*args)
    engine = BackgroundEngine(static)
    try:
        engine.prepare(24, max(len(p) for p in prompts) + 6)
        assert sorted(static._graphs) == [1, 2, 4, 8, 16, 32]  # noqa: SLF001
        graphs = {b: graph for b, (graph, _) in static._graphs.items()}  # noqa: SLF001
        results = engine.generate(reqs)
        again = {b: graph for b, (graph, _) in static._graphs.items()}  # noqa: SLF001
        assert again.keys() == graphs.keys()
        assert all(again[b] is graphs[b] for b in graphs)  # none captured again
    finally:
        engine.close()
    cached = CachedHFEngine(*args).generate(reqs)
    assert [r.response_ids for r in results] == [r.response_ids for r in cached]


def test_a_one_token_prompt_joins_beside_others_unharmed(tok):
    """A request with nothing to prefill (its prompt one token, no prefix) joining in the
    same step as others: nothing of the others' prefill may reach its row."""
    model = build_model(ModelConfig(), len(tok), 0)
    args = (model, tok, 1.0, -1, tok.pad_token_id)
    prompts = _prompts(tok, 4)
    prompts[1] = prompts[1][:1]
    reqs = [GenRequest(f"r{i}", p, 5, greedy=True) for i, p in enumerate(prompts)]
    together = {r.request_id: r for r in StaticHFEngine(*args).generate(reqs)}
    for req in reqs:
        [alone] = CachedHFEngine(*args).generate([req])
        assert together[req.request_id].response_ids == alone.response_ids
        assert together[req.request_id].response_logprobs == pytest.approx(
            alone.response_logprobs, abs=1e-5
        )


def test_auto_is_hf_cached_on_a_cpu_and_hf_static_on_a_gpu(tok):
    """The default engine (rollout.name=auto) follows the policy's device; a model with
    sliding-window layers (which hf_static refuses) keeps hf_cached."""
    model = build_model(ModelConfig(), len(tok), 0)
    assert load_config().actor_rollout_ref.rollout.name == "auto"
    assert engine_name("auto", model) == "hf_cached"
    assert isinstance(make_engine(load_config(), model, tok, seed=0), CachedHFEngine)
    assert engine_name("hf_static", model) == "hf_static"  # a name given is kept
    if torch.cuda.is_available():
        model = model.cuda()
        assert engine_name("auto", model) == "hf_static"
        model.config.layer_types = ["sliding_attention", "full_attention"]
        assert engine_name("auto", model) == "hf_cached"
