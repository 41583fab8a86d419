"""A flattened model computes, trains, saves and loads as before, its tied weights still tied,
and its weights (with a flat copy's) are one copy for the in-place handoff's plan."""

from __future__ import annotations

import copy
import io

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncrl.models.flat import (
    ALIGN_ELEMENTS,
    copy_model,
    flat_copies,
    flatten_parameters,
    is_flat,
)
from asyncrl.sync.buckets import named_tensors
from asyncrl.sync.copy_plan import CopyPlan


def _model(vocab: int = 97) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()


def test_a_flat_model_computes_and_trains_as_before():
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    apart = _model()
    flat = copy.deepcopy(apart)
    params = list(flat.parameters())
    assert flatten_parameters(flat) == 1  # one dtype, one device
    assert [id(p) for p in flat.parameters()] == [id(p) for p in params]  # the same objects
    assert is_flat(flat) and not is_flat(apart)
    assert flat.lm_head.weight is flat.model.embed_tokens.weight
    storages = {p.untyped_storage().data_ptr() for p in flat.parameters()}
    assert len(storages) == 1
    for p in flat.parameters():
        assert p.data_ptr() % (ALIGN_ELEMENTS * p.element_size()) == 0
    assert torch.equal(flat(ids).logits, apart(ids).logits)

    for model in (apart, flat):  # one AdamW step each, the same update
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(ids, labels=ids).loss.backward()
        opt.step()
    for (name, a), (_, f) in zip(apart.named_parameters(), flat.named_parameters(), strict=True):
        assert torch.equal(a, f), name
    assert is_flat(flat)  # the step wrote into the buffer


def test_a_flat_models_state_saves_and_loads_into_one_that_is_not():
    flat = _model()
    flatten_parameters(flat)
    with torch.no_grad():
        for p in flat.parameters():
            p.add_(1)
    buf = io.BytesIO()
    torch.save(flat.state_dict(), buf)
    buf.seek(0)
    other = _model()
    other.load_state_dict(torch.load(buf, weights_only=True))
    for (name, a), (_, b) in zip(
        flat.state_dict().items(), other.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    again = _model()  # and the other way round: loading copies into the flat buffer
    flatten_parameters(again)
    again.load_state_dict(other.state_dict())
    assert is_flat(again) and torch.equal(again.model.norm.weight, flat.model.norm.weight)


def test_a_flat_model_and_its_deep_copy_are_one_copy_apart():
    """The in-flight update's shadow (``copy_model``: ``copy.deepcopy`` alone copies each
    parameter apart) and the live model it is swapped into."""
    live = _model()
    assert not is_flat(copy_model(live))
    flatten_parameters(live)
    shadow = copy_model(live)
    assert shadow.lm_head.weight is shadow.model.embed_tokens.weight
    with torch.no_grad():
        for p in shadow.parameters():
            p.mul_(-1)
    assert is_flat(shadow)
    plan = CopyPlan(list(zip(live.parameters(), shadow.parameters(), strict=True)), way="foreach")
    assert len(plan.pairs) == 1 and plan.tensors == len(list(live.parameters()))
    plan.run()
    for a, b in zip(live.parameters(), shadow.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_trainer_and_a_worker_layout_of_the_same_weights_cast_in_one_copy():
    """A float32 trainer's flat weights into a bf16 worker's: one cast over the buffer. A size
    that is no multiple of ``ALIGN_ELEMENTS`` leaves a gap at both ends, which splits the
    copy there and nowhere else."""
    trainer = named_tensors(_model())
    trainer["odd"] = torch.randn(7)  # a gap after it
    trainer["after"] = torch.randn(5, 3)
    src = flat_copies(trainer)
    zeros: dict[int, torch.Tensor] = {}  # the tied name still one tensor
    dst = flat_copies(
        {
            k: zeros.setdefault(id(v), torch.zeros_like(v, dtype=torch.bfloat16))
            for k, v in trainer.items()
        }
    )
    seen: set[int] = set()  # each tensor under its first name
    unique = [k for k, t in src.items() if not (id(t) in seen or seen.add(id(t)))]
    plan = CopyPlan([(dst[k], src[k]) for k in unique], way="large_apart")
    assert len(plan.pairs) == 2 and plan.tensors == len(unique)
    plan.run()
    for k in unique:
        assert torch.equal(dst[k], src[k].to(torch.bfloat16)), k
