"""The sim engine's latency model: long-tail lengths, capacity, continuation, step time."""

from __future__ import annotations

import time

import pytest
import torch

from asyncrl.config import SimConfig
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.sim import SimEngine, target_length

EOS = 2


def _engine(**sim: float | str) -> SimEngine:
    return SimEngine(torch.nn.Linear(2, 2), SimConfig(**sim), vocab_size=30, eos_token_id=EOS)


def test_lengths_have_a_long_tail_and_depend_only_on_the_request():
    sim = SimConfig(long_tail_fraction=0.1, short_mean_fraction=0.15)
    lengths = [target_length(f"s{i}#0", 200, sim) for i in range(4000)]
    long = sum(1 for n in lengths if n >= 160) / len(lengths)
    assert 0.08 < long < 0.12  # the tail (plus a few exponential draws that reach it)
    short = sorted(n for n in lengths if n < 160)
    assert 17 <= short[len(short) // 2] <= 25  # median of an exponential of mean 30: 30 ln 2
    assert all(1 <= n <= 200 for n in lengths)
    assert lengths[:50] == [target_length(f"s{i}#0", 200, sim) for i in range(50)]
    other_seed = SimConfig(long_tail_fraction=0.1, short_mean_fraction=0.15, seed=1)
    assert lengths[:50] != [target_length(f"s{i}#0", 200, other_seed) for i in range(50)]


def test_capacity_limits_the_sequences_advanced_per_step():
    engine = _engine(capacity=3, decode_step_s=1e-4)
    for i in range(5):
        engine.add(GenRequest(f"r{i}", [1, 5], max_new_tokens=500))
    engine.step()
    assert engine.tokens == 3
    engine.step()
    assert engine.tokens == 6


def test_interrupted_and_continued_ends_where_uninterrupted_does():
    whole = _engine(decode_step_s=1e-4)
    [ref] = whole.generate([GenRequest("a#1", [1, 5], max_new_tokens=64)])
    assert ref.response_ids[-1] == EOS or ref.finish_reason == "length"

    cut = _engine(decode_step_s=1e-4)
    cut.add(GenRequest("a#1", [1, 5], max_new_tokens=64))
    cut.step()
    [part] = cut.abort_all()
    assert part.finish_reason == "abort" and len(part.response_ids) == 1
    [done] = cut.generate(
        [
            GenRequest(
                "a#1",
                [1, 5],
                max_new_tokens=64,
                prefix_ids=part.response_ids,
                prefix_logprobs=part.response_logprobs,
            )
        ]
    )
    assert len(done.response_ids) == len(ref.response_ids)
    assert done.response_ids[:1] == part.response_ids
    assert done.finish_reason == ref.finish_reason


def test_a_step_takes_the_modelled_time():
    engine = _engine(decode_step_s=0.02)
    engine.add(GenRequest("t#0", [1, 5], max_new_tokens=10_000))
    engine.step()  # the first step starts the clock
    t0 = time.monotonic()
    for _ in range(10):
        engine.step()
    assert time.monotonic() - t0 >= 10 * 0.02 * 0.95


def test_time_with_nothing_to_decode_is_not_banked():
    """After the engine ran empty (a sync, a pause), its clock starts again when work comes
    back: the idle time is not spent on decoding steps. (It was, when many requests came back
    at once: the stall threshold scaled with the step time of the new, larger batch.)"""
    engine = _engine(capacity=1, decode_step_s=0.02, scheduling="shared")
    engine.add(GenRequest("first", [1], max_new_tokens=1))
    while engine.num_active:
        engine.step()
    time.sleep(0.5)  # idle: nothing in flight
    for i in range(10):  # a step now models 10 x 0.02 = 0.2 s
        engine.add(GenRequest(f"r{i}#0", [1], max_new_tokens=1_000))
    t0, steps = time.monotonic(), engine.steps
    while engine.steps < steps + 3:
        engine.step()
    assert time.monotonic() - t0 >= 2 * 0.2 * 0.95  # the first step is due at once, then 0.2 s


def test_shared_scheduling_advances_every_sequence_and_slows_above_capacity():
    engine = _engine(capacity=2, decode_step_s=0.01, scheduling="shared")
    for i in range(5):
        engine.add(GenRequest(f"r{i}", [1, 5], max_new_tokens=500))
    assert engine.step_s() == pytest.approx(0.025)  # 5 sequences on a capacity of 2
    engine.decode_step()
    assert engine.tokens == 5
    engine.abort(["r0", "r1", "r2", "r3"])
    assert engine.step_s() == pytest.approx(0.01)  # below capacity: memory-bound, flat
