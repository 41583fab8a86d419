"""The engines' grouped decoding attention: sdpa's results without copying key/value heads."""

import copy
from contextlib import nullcontext

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import asyncrl.producers.engines.attention as attention
from asyncrl.producers.engines.attention import NAME, grouped_decoding
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.cached import CachedHFEngine
from asyncrl.producers.engines.static import StaticHFEngine


@pytest.fixture(scope="module")
def gqa_model():
    """A small Qwen2 with grouped heads (8 query heads over 2 key/value heads), as 0.5B has."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture
def delegated(monkeypatch):
    """The calls the grouped function hands to transformers' sdpa."""
    calls: list[int] = []
    sdpa = attention.sdpa_attention_forward

    def counting(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return sdpa(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", counting)
    return calls


@torch.no_grad()
def test_a_padded_decoding_step_gives_sdpas_logits(gqa_model, delegated):
    """Rows of different lengths (left padding, so a mask), one new token each: the logits of
    sdpa's repeated heads, to float32 rounding; the step never reaches sdpa."""
    ids = torch.randint(3, 97, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    mask[3, :2] = 0
    prefill = gqa_model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
    positions = mask.sum(-1, keepdim=True) - 1
    step = dict(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions, use_cache=True)
    cache = prefill.past_key_values
    expected = gqa_model(**step, past_key_values=copy.deepcopy(cache)).logits
    with grouped_decoding(gqa_model):
        assert gqa_model.config._attn_implementation == NAME
        delegated.clear()
        got = gqa_model(**step, past_key_values=copy.deepcopy(cache)).logits
    assert delegated == []
    assert gqa_model.config._attn_implementation == "sdpa"  # restored
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


@torch.no_grad()
def test_prefill_and_training_passes_stay_on_sdpa(gqa_model, delegated):
    """Several query tokens a row (a prefill, the trainer's passes): sdpa's own function, so
    the logits are bitwise those outside the context."""
    ids = torch.randint(3, 97, (2, 9))
    expected = gqa_model(input_ids=ids).logits
    with grouped_decoding(gqa_model):
        got = gqa_model(input_ids=ids).logits
    assert delegated == [9, 9]  # both layers, all nine tokens
    assert torch.equal(got, expected)


def test_the_engines_make_the_same_tokens_and_logprobs_as_before(gqa_model, monkeypatch):
    """hf_cached and hf_static over the grouped step against themselves over sdpa: the same
    sampled tokens, logprobs within 1e-5."""
    reqs = [GenRequest(f"r{i}", list(range(3 + i, 9 + 2 * i)), 6) for i in range(5)]
    for engine_class in (CachedHFEngine, StaticHFEngine):
        args = (gqa_model, None, 1.0, -1, 0)
        grouped = engine_class(*args, seed=3).generate(reqs)
        with monkeypatch.context() as patch:
            for module in ("cached", "static"):
                name = f"asyncrl.producers.engines.{module}.grouped_decoding"
                patch.setattr(name, lambda model: nullcontext())
            plain = engine_class(*args, seed=3).generate(reqs)
        assert [r.response_ids for r in grouped] == [r.response_ids for r in plain]
        for g, p in zip(grouped, plain, strict=True):
            assert g.response_logprobs == pytest.approx(p.response_logprobs, abs=1e-5)


def test_an_eager_model_is_left_as_it_is(gqa_model):
    eager = copy.deepcopy(gqa_model)
    eager.config._attn_implementation = "eager"
    with grouped_decoding(eager):
        assert eager.config._attn_implementation == "eager"
