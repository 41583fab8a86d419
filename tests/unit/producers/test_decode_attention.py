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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_on_a_gpu_in_bf16_the_step_reads_the_cache_as_it_is_and_matches_sdpa(gqa_model):
    """bf16 on a GPU: float32 scores straight from the bf16 cache (one GEMM, no float32 copy
    of the keys), probabilities times values in bf16 as flash attention does: sdpa's logits
    within bf16 noise."""
    model = copy.deepcopy(gqa_model).to("cuda", torch.bfloat16)
    ids = torch.randint(3, 97, (4, 12), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    prefill = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
    positions = mask.sum(-1, keepdim=True) - 1
    step = dict(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions, use_cache=True)
    cache = prefill.past_key_values
    expected = model(**step, past_key_values=copy.deepcopy(cache)).logits.float()
    with grouped_decoding(model):
        got = model(**step, past_key_values=copy.deepcopy(cache)).logits.float()
    fast = attention._FLOAT32_OUT["ok"]
    assert (got - expected).abs().max() < 5e-2, ((got - expected).abs().max(), fast)


@torch.no_grad()
def test_the_gpu_path_s_shapes_and_math_on_the_cpu(monkeypatch):
    """The half-precision GPU branch run on the CPU (``bmm``'s ``out_dtype``, CUDA only, done
    as a float32 GEMM of the same operands) against attention with repeated heads in float64:
    bf16 rounding apart, the same output. Catches a wrong grouping of heads or rows."""
    bmm = torch.bmm

    def bmm_float32_out(a, b, out_dtype=None):
        assert out_dtype == torch.float32 and a.dtype == b.dtype == torch.bfloat16
        return bmm(a.float(), b.float())

    monkeypatch.setattr(attention, "_half_on_gpu", lambda t: t.dtype == torch.bfloat16)
    monkeypatch.setattr(attention.torch, "bmm", bmm_float32_out)
    g = torch.Generator().manual_seed(0)
    b, heads, kv, length, dim = 3, 8, 2, 11, 16
    q = torch.randn(b, heads, 1, dim, generator=g).to(torch.bfloat16)
    k = (2 * torch.randn(b, kv, length, dim, generator=g)).to(torch.bfloat16)
    v = torch.randn(b, kv, length, dim, generator=g).to(torch.bfloat16)
    mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :4] = False
    got, _ = attention.grouped_decode_attention(None, q, k, v, mask)  # type: ignore[arg-type]
    rep = heads // kv  # query head h reads key/value head h // rep (transformers' repeat_kv)
    k64, v64 = (t.double().repeat_interleave(rep, dim=1) for t in (k, v))
    scores = (q.double() @ k64.transpose(-1, -2)) * dim**-0.5
    want = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v64  # [b, h, 1, d]
    err = (got.double() - want.transpose(1, 2)).abs().max()
    assert err < 3e-2, err  # bf16 output; a head read from the wrong group is off by ~1
