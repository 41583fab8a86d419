"""A sampled validation's top-p, top-k and temperature (verl's rollout.val_kwargs; DAPO
validates at top_p 0.7): the filter against values worked out by hand, then on an engine."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.cached import CachedHFEngine
from asyncrl.producers.engines.hf import HFEngine, filtered_probs

P = torch.tensor([[0.05, 0.5, 0.15, 0.3]])


def test_nucleus_keeps_the_likeliest_tokens_up_to_the_one_crossing_top_p():
    # sorted 0.5, 0.3 | 0.15, 0.05: the mass before 0.15 is 0.8 >= 0.7
    assert filtered_probs(P, top_p=0.7)[0].tolist() == pytest.approx([0, 0.5, 0, 0.3])
    assert filtered_probs(P, top_p=0.5)[0].tolist() == pytest.approx([0, 0.5, 0, 0])
    assert filtered_probs(P, top_k=2)[0].tolist() == pytest.approx([0, 0.5, 0, 0.3])
    assert filtered_probs(P, top_p=0.9, top_k=1)[0].tolist() == pytest.approx([0, 0.5, 0, 0])
    assert torch.equal(filtered_probs(P), P) and torch.equal(filtered_probs(P, 1.0, 0), P)


@pytest.mark.parametrize("engine", [HFEngine, CachedHFEngine])
def test_sampling_with_top_k_1_is_greedy(engine):
    cfg = load_config(overrides=["actor_rollout_ref.model.hidden_size=32"])
    tok = build_tokenizer()
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=0).eval()
    prompts = [tok(f"{i:02d}+{(3 * i) % 100:02d}=")["input_ids"] for i in range(8)]
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)

    def run(greedy: bool, **kw) -> list[list[int]]:
        reqs = [GenRequest(str(i), p, 4, greedy=greedy) for i, p in enumerate(prompts)]
        return [r.response_ids for r in engine(*args, seed=1, **kw).generate(reqs)]

    greedy = run(True)
    assert run(False, top_k=1) == greedy
    assert run(False, top_p=1e-6) == greedy  # the likeliest token alone crosses it
    assert run(False) != greedy  # plain sampling from a random model differs


def test_verls_val_kwargs_load():
    key = "actor_rollout_ref.rollout.val_kwargs"
    val = load_config(
        overrides=[f"{key}.do_sample=true", f"{key}.top_p=0.7", f"{key}.temperature=1.0"]
    ).actor_rollout_ref.rollout.val_kwargs
    assert (val.top_p, val.top_k, val.temperature) == (0.7, -1, 1.0)
    defaults = [
        f"{key}.temperature=0",
        f"{key}.top_k=-1",
        f"{key}.top_p=1.0",
        f"{key}.do_sample=false",
    ]
    assert load_config(overrides=defaults).actor_rollout_ref.rollout.val_kwargs.temperature == 0
