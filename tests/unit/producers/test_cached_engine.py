"""hf_cached: the hf engine's tokens and logprobs, from a KV cache that requests join and leave
between steps and that new weights invalidate (the random scripts run hf_static too). (The
contract the engines share is tested in test_hf_engine.py, parametrized over them.)"""

import contextlib
import random
from typing import Any

import pytest
import torch

from asyncrl.config import ModelConfig, load_config
from asyncrl.consumers.grpo import rollout_logprob_errors
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.models.warm_start import load_policy
from asyncrl.producers.engines.base import GenRequest, GenResult
from asyncrl.producers.engines.cached import CachedHFEngine, keep_rows
from asyncrl.producers.engines.factory import make_engine
from asyncrl.producers.engines.hf import HFEngine
from asyncrl.producers.engines.static import StaticHFEngine
from asyncrl.tasks.arithmetic import make_problem

TOLERANCE = 1e-4
"""What test_hf_engine.py allows between a recorded logprob and its recomputation."""


@pytest.fixture(scope="module")
def policy():
    """The demo policy after a 100-step warm start (cached, as test_worker_loop's)."""
    return load_policy(load_config(overrides=["actor_rollout_ref.model.warmup_steps=100"]))


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok(make_problem(7 * i % 100, 13 * i % 100).prompt)["input_ids"] for i in range(n)]


def _recomputed(model, results: list[GenResult], temperature: float = 1.0) -> torch.Tensor:
    """|recorded - the trainer's logprob| of every response token, ``[B, R]``."""
    rows = [(r.prompt_ids, r.response_ids, r.response_logprobs, 0.0) for r in results]
    return rollout_logprob_errors(model, rows, pad_token_id=0, temperature=temperature)


def test_greedy_tokens_are_the_hf_engines_and_logprobs_the_trainers(policy):
    model, tok = policy
    reqs = [  # answers are ~2 digits and EOS: some stop, some are cut at 2 tokens
        GenRequest(str(i), p, 2 + i % 2, greedy=True) for i, p in enumerate(_prompts(tok, 64))
    ]
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    hf = HFEngine(*args).generate(reqs)
    cached = CachedHFEngine(*args).generate(reqs)
    assert [r.response_ids for r in cached] == [r.response_ids for r in hf]
    assert [r.finish_reason for r in cached] == [r.finish_reason for r in hf]
    assert {r.finish_reason for r in hf} == {"stop", "length"}
    assert float(_recomputed(model, cached).max()) < TOLERANCE
    assert float(_recomputed(model, hf).max()) < TOLERANCE


def test_a_sequence_scores_the_same_whoever_joins_or_leaves_its_batch(policy):
    """Requests join at different steps, finish, are aborted or re-added under the same id:
    each one's tokens and logprobs are those it gets generated alone."""
    model, tok = policy
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    prompts = _prompts(tok, 8)
    prompts[3] = prompts[3][:1]  # <bos> alone: nothing to prefill
    reqs = [GenRequest(f"r{i}", p, 3 + i % 4, greedy=True) for i, p in enumerate(prompts)]
    alone = {r.request_id: HFEngine(*args).generate([r])[0] for r in reqs}

    engine = CachedHFEngine(*args)
    done: dict[str, GenResult] = {}
    for i, req in enumerate(reqs):
        engine.add(req)
        if i == 2:  # r1 is cut after its tokens so far and continued as a new request
            [cut] = engine.abort(["r1"])
            continued = GenRequest(
                "r1",
                cut.prompt_ids,
                reqs[1].max_new_tokens,
                prefix_ids=cut.response_ids,
                prefix_logprobs=cut.response_logprobs,
                greedy=True,
            )
            engine.add(continued)
        done.update((r.request_id, r) for r in engine.step())
    while engine.num_active:
        done.update((r.request_id, r) for r in engine.step())
    for rid, want in alone.items():
        assert done[rid].response_ids == want.response_ids
        assert done[rid].response_logprobs == pytest.approx(want.response_logprobs, abs=1e-5)


def test_requests_sharing_a_context_are_prefilled_once_and_score_as_alone(policy):
    """A sample's trajectories join with one prompt: the prefill computes each distinct
    context once (a continuation's context is its own: its prompt and prefix, less the last
    token), and every request still gets the tokens and logprobs it gets generated alone."""
    model, tok = policy
    args = (model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    firsts = HFEngine(*args).generate(
        [GenRequest(f"c{i}", p, 3, greedy=True) for i, p in enumerate(_prompts(tok, 8))]
    )
    # One whose answer is more than EOS: the continuation has a token still to generate.
    first = next(r for r in firsts if len(r.response_ids) >= 2)
    p0, p1 = first.prompt_ids, next(r.prompt_ids for r in firsts if r is not first)
    reqs = [GenRequest(f"a{i}", p0, 2 + i % 2, greedy=True) for i in range(4)]
    reqs += [GenRequest(f"b{i}", p1, 3, greedy=True) for i in range(3)]
    cut = first.response_ids[:1], first.response_logprobs[:1]
    reqs.append(GenRequest("c", p0, 3, prefix_ids=cut[0], prefix_logprobs=cut[1], greedy=True))
    alone = {r.request_id: HFEngine(*args).generate([r])[0] for r in reqs[:-1]}
    alone["c"] = first

    prefilled: list[int] = []

    def count(_module, _args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefilled.append(kwargs["input_ids"].shape[0])

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        done = {r.request_id: r for r in CachedHFEngine(*args).generate(reqs)}
    finally:
        hook.remove()
    assert prefilled == [3]  # p0 and p1 less their last token, and p0: not 8 rows
    for rid, want in alone.items():
        assert done[rid].response_ids == want.response_ids
        assert done[rid].response_logprobs == pytest.approx(want.response_logprobs, abs=1e-5)


def test_rows_kept_after_a_drop_are_the_selected_rows_from_the_cut_column():
    t = torch.arange(5 * 2 * 6 * 3, dtype=torch.float32).reshape(5, 2, 6, 3)
    index = torch.tensor([0, 2, 3])
    kept = keep_rows(t, index, 2, dim=2)
    assert torch.equal(kept, t[index, :, 2:])
    assert kept.is_contiguous() and kept.data_ptr() != t.data_ptr()


def _finish(engine) -> list[GenResult]:
    done: dict[str, GenResult] = {}
    while engine.num_active:
        done.update((r.request_id, r) for r in engine.step())
    return [done[rid] for rid in sorted(done)]


def test_tokens_after_a_weight_change_score_under_the_new_weights():
    tok = build_tokenizer()
    cfg = ModelConfig()  # the demo's shape, random weights
    told, stale = (
        CachedHFEngine(build_model(cfg, len(tok), 0), tok, 1.0, -1, tok.pad_token_id)  # no eos
        for _ in range(2)
    )
    reqs = [GenRequest(str(i), p, 8) for i, p in enumerate(_prompts(tok, 6))]
    for engine in (told, stale):
        for req in reqs:
            engine.add(req)
        engine.step()
        engine.step()
    old, new = build_model(cfg, len(tok), 0), build_model(cfg, len(tok), 1)
    for engine in (told, stale):  # a sync copies new tensors in place between two tokens
        engine.model.load_state_dict(new.state_dict())
    told.weights_changed()  # (stale is not told)

    results = _finish(told)
    assert float(_recomputed(old, results)[:, :2].max()) < TOLERANCE
    assert float(_recomputed(new, results)[:, 2:].max()) < TOLERANCE
    # Not told, the engine would score them against keys and values of the old weights.
    assert float(_recomputed(new, _finish(stale))[:, 2:].max()) > 100 * TOLERANCE


def _script(seed: int, vocab: int) -> list[tuple[str, Any]]:
    """Random engine calls: requests (some with a prefix) join under 7 ids, ids are aborted
    (and re-added later), one of two weight sets is loaded between two steps."""
    rng = random.Random(seed)
    ops: list[tuple[str, Any]] = []
    for _ in range(60):
        r = rng.random()
        if r < 0.3:
            prompt = [1, *(rng.randrange(4, vocab) for _ in range(rng.randrange(11)))]
            prefix = [rng.randrange(4, vocab) for _ in range(rng.randrange(4))] if r < 0.1 else []
            rid, budget = f"r{rng.randrange(7)}", rng.randint(1, 12)
            req = GenRequest(rid, prompt, budget, prefix, [-1.0] * len(prefix), greedy=True)
            ops.append(("add", req))
        elif r < 0.38:
            ops.append(("abort", [f"r{rng.randrange(7)}" for _ in range(2)]))
        elif r < 0.41:
            ops.append(("load", rng.randrange(2)))
        else:
            ops.append(("step", None))
    return ops


def _play(engine, ops: list[tuple[str, Any]], weights: list[dict]) -> list[GenResult]:
    out: list[GenResult] = []
    for op, arg in ops:
        if op == "add":
            with contextlib.suppress(ValueError):  # its id is still active
                engine.add(arg)
        elif op == "abort":
            out += engine.abort(arg)
        elif op == "load":
            engine.model.load_state_dict(weights[arg])
            engine.weights_changed()
        else:
            out += engine.step()
    return out + _finish(engine)


@pytest.mark.parametrize("seed", range(8))
def test_random_joins_aborts_and_weight_changes_give_the_hf_engines_results(seed):
    """Each cached engine (CachedHFEngine, StaticHFEngine) against one play of the script on
    the reference HFEngine (the slowest of the three: it was played once per engine)."""
    tok = build_tokenizer()
    small = ModelConfig(hidden_size=32, intermediate_size=64)
    weights = [build_model(small, len(tok), s).state_dict() for s in (0, 1)]
    ops = _script(seed, len(tok))

    def play(cls: type) -> list[GenResult]:
        return _play(cls(build_model(small, len(tok), 0), tok, 1.0, 2, 0), ops, weights)

    hf = play(HFEngine)
    for cached_cls in (CachedHFEngine, StaticHFEngine):
        cached = play(cached_cls)
        assert [(r.request_id, r.response_ids, r.finish_reason) for r in cached] == [
            (r.request_id, r.response_ids, r.finish_reason) for r in hf
        ], cached_cls.__name__
        for a, b in zip(hf, cached, strict=True):
            assert b.response_logprobs == pytest.approx(a.response_logprobs, abs=1e-5)


def test_the_factory_makes_hf_cached_from_the_config():
    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=hf_cached"])
    tok = build_tokenizer()
    engine = make_engine(cfg, build_model(ModelConfig(), len(tok), 0), tok, seed=0)
    assert isinstance(engine, CachedHFEngine)
