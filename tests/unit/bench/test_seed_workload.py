"""The seed-shaped workload of ``bench modes``: its modelled costs are the seed's figures."""

from __future__ import annotations

import pytest
import torch

from asyncrl.bench.workloads import (
    SEED_BASE,
    active_per_step,
    batch_steps,
    fit_rollout,
    seed,
    seed_speedup,
    seed_speedup_equal_tokens,
    shared_batch_steps,
)
from asyncrl.config import SimConfig, load_config
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.sim import SimEngine, target_length


def test_the_fit_reproduces_the_seeds_generation_times():
    """Scaled back by 1/time_scale: one unit makes a step's tokens in the 64-GPU gen time
    (150.72 s), two units generate a step's batch in the 128-GPU colocated gen time (177.85 s)."""
    fit = fit_rollout(load_config(None, SEED_BASE), batch=32, time_scale=0.01)
    assert fit.colocated_gen_s / 0.01 == pytest.approx(177.85)
    assert fit.unit_gen_s / 0.01 == pytest.approx(150.72, rel=0.01)
    # the tail: two units take 2.36x what their throughput would need for the batch
    assert fit.colocated_gen_s / (fit.unit_gen_s / 2) == pytest.approx(2.36, rel=0.01)


def test_the_trainer_times_are_the_seeds_step_minus_gen():
    w = seed(None, [], time_scale=0.02)
    cfg = load_config(None, w.overrides)
    assert cfg.sim.scheduling == "fcfs" and cfg.actor_rollout_ref.rollout.n == 16
    assert cfg.sim.train_s_per_sample * w.batch / 0.02 == pytest.approx(150.63 - 33.14)
    assert w.colocated_train_s_per_sample * w.batch / 0.02 == pytest.approx(356.30 - 177.85)
    trigger, require, staleness, partial = w.setups["(d) partial rollout"]
    assert (trigger, require, staleness, partial) == (4, 4, 0.5, True)  # the seed's 64:64 run
    assert trigger * require * w.mini_batch == w.batch


def test_the_seeds_speedups_come_from_its_400_step_totals():
    assert seed_speedup("(b) stream off-policy") == pytest.approx(1.58, abs=0.01)
    assert seed_speedup("(d) partial rollout") == pytest.approx(2.35, abs=0.01)
    assert seed_speedup("(c) stale samples") is None  # the seed's row is empty


def test_at_equal_tokens_the_seeds_stream_row_is_its_time_scaled_by_its_updates():
    """The stream run trained fewer tokens a step (update_actor 98.77 s against the mode (d)
    run's 113.16 s on the same 64 GPUs): at the modelled run's tokens its 1.58x is ~1.38x."""
    assert seed_speedup_equal_tokens("(d) partial rollout") == seed_speedup("(d) partial rollout")
    stream = seed_speedup_equal_tokens("(b) stream off-policy")
    assert stream == pytest.approx(seed_speedup("(b) stream off-policy") * 98.77 / 113.16)
    assert stream == pytest.approx(1.38, abs=0.01)
    assert seed_speedup_equal_tokens("(d) staleness 0.3") == pytest.approx(2.15, abs=0.01)
    assert seed_speedup_equal_tokens("colocated sync") == 1.0
    assert seed_speedup_equal_tokens("(c) stale samples") is None


@pytest.mark.parametrize("scheduling", ["shared", "fcfs"])
def test_the_fits_batch_time_is_the_engines(scheduling):
    """The closed form the fit uses equals the engine under either scheduling, stepped in
    virtual time (each step's modelled duration summed, nothing slept)."""
    sim = SimConfig(scheduling=scheduling, capacity=10, decode_step_s=0.5)
    ids = [f"q{i}#{j}" for i in range(6) for j in range(8)]
    lengths = [target_length(rid, 40, sim) for rid in ids]
    engine = SimEngine(torch.nn.Linear(2, 2), sim, vocab_size=30, eos_token_id=2)
    for rid in ids:
        engine.add(GenRequest(rid, [1], max_new_tokens=40))
    modelled = 0.0
    while engine.num_active:
        modelled += engine.step_s()
        engine.decode_step()
    assert engine.tokens == sum(lengths)
    assert modelled == pytest.approx(batch_steps(lengths, 10, scheduling) * 0.5)
    if scheduling == "shared":
        assert batch_steps(lengths, 10, scheduling) == shared_batch_steps(
            active_per_step(lengths), 10
        )


def test_the_fit_follows_the_configured_scheduling():
    """Either scheduling is fitted to the same seed times with its own closed form, so the
    capacities differ (before, the shared form was fitted whatever the engine ran)."""
    fcfs = fit_rollout(load_config(None, SEED_BASE), batch=32, time_scale=0.01)
    shared_cfg = load_config(None, [*SEED_BASE, "sim.scheduling=shared"])
    shared = fit_rollout(shared_cfg, batch=32, time_scale=0.01)
    for fit in (fcfs, shared):
        assert fit.colocated_gen_s / 0.01 == pytest.approx(177.85)
        assert fit.unit_gen_s / 0.01 == pytest.approx(150.72, rel=0.01)
    assert fcfs.capacity != shared.capacity


def test_in_flight_updates_asked_for_apply_to_the_partial_rollout_rows_alone():
    """``asyncrl bench modes async_training.in_flight_update=true``: modes (a)-(c) cannot
    update in flight (the config refuses it without partial rollout), so they run as
    always, and the mode (d) rows update in flight."""
    from asyncrl.bench.modes import _setup_overrides

    w = seed(None, ["async_training.in_flight_update=true"], time_scale=0.02)
    for name, setup in {**w.setups, **w.ablation}.items():
        cfg = load_config(None, [*w.overrides, *_setup_overrides(w, setup)])
        assert cfg.async_training.in_flight_update == name.startswith("(d)"), name
