"""The engine on a thread of its own: the request-level contract over a stepwise engine."""

import threading
import time

import pytest
import torch

from asyncrl.config import ModelConfig
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.producers.engines.background import BackgroundEngine
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.hf import HFEngine

PROMPTS = ["07+35=", "99+99=", "1+2=", "45+54="]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _stepwise(tok, latency_s: float = 0.0) -> HFEngine:
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64), len(tok), 0)
    return HFEngine(
        model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, emulated_decode_latency_s=latency_s
    )


def _requests(tok, max_new: int = 8) -> list[GenRequest]:
    return [
        GenRequest(f"r{i}", tok(p)["input_ids"], max_new, greedy=True)
        for i, p in enumerate(PROMPTS)
    ]


def test_it_generates_what_the_engine_stepped_inline_does(tok):
    inline = _stepwise(tok).generate(_requests(tok))
    engine = BackgroundEngine(_stepwise(tok))
    try:
        served = engine.generate(_requests(tok))
        assert engine.num_active == 0
    finally:
        engine.close()
    for want, got in zip(inline, served, strict=True):
        assert (got.response_ids, got.finish_reason) == (want.response_ids, want.finish_reason)
        assert got.response_logprobs == want.response_logprobs


def test_an_abort_returns_the_tokens_so_far_and_a_continuation_ends_where_it_would_have(tok):
    full = _stepwise(tok).generate(_requests(tok, max_new=24))
    engine = BackgroundEngine(_stepwise(tok, latency_s=0.01))
    try:
        for req in _requests(tok, max_new=24):
            engine.add(req)
        time.sleep(0.05)  # a few decoding steps on the engine's thread
        cut = {r.request_id: r for r in engine.abort()}
        assert set(cut) == {r.request_id for r in full} and engine.num_active == 0
        assert engine.collect(timeout=0.05) == []  # aborted: never collected as well
        resumed = engine.generate(
            [
                GenRequest(
                    rid,
                    r.prompt_ids,
                    24,
                    prefix_ids=r.response_ids,
                    prefix_logprobs=r.response_logprobs,
                    greedy=True,
                )
                for rid, r in sorted(cut.items())
            ]
        )
    finally:
        engine.close()
    assert any(r.finish_reason == "abort" for r in cut.values())
    for want, got in zip(full, resumed, strict=True):
        assert got.response_ids == want.response_ids
        assert got.response_logprobs == pytest.approx(want.response_logprobs, abs=1e-5)


def test_a_weight_update_runs_on_the_engines_thread_between_two_steps(tok):
    engine = BackgroundEngine(_stepwise(tok, latency_s=0.01))
    threads = []

    def apply(model: torch.nn.Module) -> str:
        threads.append(threading.current_thread().name)
        for p in model.parameters():
            p.add_(0.01)
        return "loaded"

    try:
        for req in _requests(tok, max_new=24):
            engine.add(req)
        time.sleep(0.03)
        assert engine.update_weights(apply) == "loaded"
        assert threads == ["engine"]
        with pytest.raises(ValueError, match="bad weights"):
            engine.update_weights(lambda m: (_ for _ in ()).throw(ValueError("bad weights")))
        assert len(engine.generate([GenRequest("more", tok("1+1=")["input_ids"], 4)])) == 1
    finally:
        engine.close()


def test_a_failure_on_the_engines_thread_is_raised_to_the_caller_and_abort_still_answers(tok):
    stepwise = _stepwise(tok)
    calls = [0]
    step = stepwise.step

    def failing_step():
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("CUDA error: out of memory")
        return step()

    stepwise.step = failing_step
    engine = BackgroundEngine(stepwise)
    for req in _requests(tok, max_new=24):
        engine.add(req)
    with pytest.raises(RuntimeError, match="out of memory"):
        for _ in range(50):
            engine.collect(timeout=0.1)
    cut = engine.abort()
    assert {r.request_id for r in cut} == {f"r{i}" for i in range(len(PROMPTS))}
    assert all(len(r.response_ids) == 1 for r in cut)  # the one step made before the failure
    engine.close()
