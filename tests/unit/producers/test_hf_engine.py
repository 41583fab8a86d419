"""The engines' contract: interruptible between tokens, continuable from a prefix (the hf
engine, hf_cached, its KV-cached twin, hf_static, its slotted-cache twin, and vllm alike).

The model's heads are 32 wide, a width vLLM's CPU attention runs. vLLM takes ~15 s to start,
so its case shares one engine, given the weights and seed each test asks for."""

import importlib.util

import pytest
import torch

from asyncrl.config import ModelConfig
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.cached import CachedHFEngine
from asyncrl.producers.engines.hf import HFEngine
from asyncrl.producers.engines.static import StaticHFEngine

PROMPTS = ["07+35=", "99+99=", "1+2=", "45+54="]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


HAS_VLLM = importlib.util.find_spec("vllm") is not None
VLLM = "vllm"
SHAPE = ModelConfig(hidden_size=64, num_attention_heads=2, intermediate_size=64)
_shared: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _close_shared():
    """Close the shared vLLM engine after the module: a process holds one live vLLM engine."""
    yield
    engine = _shared.pop(VLLM, None)
    if engine is not None:
        engine.close()


@pytest.fixture(
    params=[
        HFEngine,
        CachedHFEngine,
        StaticHFEngine,
        pytest.param(
            VLLM, marks=pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed (VLLM=none)")
        ),
    ],
    ids=["hf", "hf_cached", "hf_static", "vllm"],
)
def engine_cls(request):
    return request.param


def _engine(tok, cls=HFEngine, seed: int = 0, model_seed: int = 0):
    model = build_model(SHAPE, len(tok), model_seed)
    if cls != VLLM:
        return cls(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=seed)
    from asyncrl.producers.engines.vllm_engine import VLLMEngine

    engine = _shared.get(VLLM)
    if engine is None:
        engine = _shared[VLLM] = VLLMEngine(
            model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=seed
        )
    engine.abort()
    engine.seed = seed
    engine.update_weights(lambda m: m.load_state_dict(model.state_dict()))
    return engine


def _requests(tok, greedy: bool) -> list[GenRequest]:
    return [
        GenRequest(f"r{i}", tok(p)["input_ids"], 8, greedy=greedy) for i, p in enumerate(PROMPTS)
    ]


def test_interrupted_greedy_generation_continues_to_the_same_tokens(tok, engine_cls):
    engine = _engine(tok, engine_cls)
    full = engine.generate(_requests(tok, greedy=True))

    for req in _requests(tok, greedy=True):
        engine.add(req)
    engine.step()
    engine.step()
    cut = {r.request_id: r for r in engine.abort_all()}
    assert engine.num_active == 0
    assert all(r.finish_reason == "abort" for r in cut.values())
    resumed = engine.generate(
        [
            GenRequest(
                rid,
                r.prompt_ids,
                8,
                prefix_ids=r.response_ids,
                prefix_logprobs=r.response_logprobs,
                greedy=True,
            )
            for rid, r in cut.items()
        ]
    )
    for want, got in zip(full, resumed, strict=True):
        assert got.response_ids == want.response_ids
        assert got.response_logprobs == pytest.approx(want.response_logprobs, abs=1e-5)
        assert got.finish_reason == want.finish_reason


def test_a_continuation_scores_new_tokens_with_the_new_weights(tok, engine_cls):
    engine = _engine(tok, engine_cls)
    for req in _requests(tok, greedy=False):
        engine.add(req)
    engine.step()
    cut = engine.abort_all()
    before = {r.request_id: r.response_logprobs[0] for r in cut}
    other = _engine(tok, model_seed=1).model
    engine.update_weights(lambda m: m.load_state_dict(other.state_dict()))  # a sync, in place
    resumed = engine.generate(
        [
            GenRequest(
                r.request_id,
                r.prompt_ids,
                8,
                prefix_ids=r.response_ids,
                prefix_logprobs=r.response_logprobs,
            )
            for r in cut
        ]
    )
    fresh = _engine(tok, model_seed=1).model
    for r in resumed:
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(fresh(input_ids=ids).logits[0].float(), -1)
        p = len(r.prompt_ids)
        new = [float(logp[p + t - 1, r.response_ids[t]]) for t in range(1, len(r.response_ids))]
        assert r.response_logprobs[1:] == pytest.approx(new, abs=1e-4)
        assert r.response_logprobs[0] == before[r.request_id]  # the prefix is kept


def test_a_finished_prefix_is_returned_as_it_is(tok, engine_cls):
    engine = _engine(tok, engine_cls)
    prompt = tok("1+2=")["input_ids"]
    eos = tok.eos_token_id
    [res] = engine.generate(
        [GenRequest("x", prompt, 8, prefix_ids=[7, eos], prefix_logprobs=[-1.0, -0.5])]
    )
    assert (res.response_ids, res.finish_reason) == ([7, eos], "stop")


def test_abort_drops_only_the_named_requests_and_the_rest_go_on(tok, engine_cls):
    engine = _engine(tok, engine_cls)
    full = {r.request_id: r for r in engine.generate(_requests(tok, greedy=True))}
    for req in _requests(tok, greedy=True):
        engine.add(req)
    engine.step()
    cut = engine.abort(["r1", "r3", "no-such-request"])
    assert sorted(r.request_id for r in cut) == ["r1", "r3"]
    assert all(r.finish_reason == "abort" and len(r.response_ids) == 1 for r in cut)
    assert engine.num_active == 2
    rest = {}
    while engine.num_active:
        rest.update({r.request_id: r for r in engine.step()})
    assert sorted(rest) == ["r0", "r2"]
    for rid, got in rest.items():  # the others' generation is unaffected by the abort
        assert got.response_ids == full[rid].response_ids
