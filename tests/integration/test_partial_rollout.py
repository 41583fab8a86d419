"""Mode (d) on the real broker: syncs interrupt generations, the log holds every partial
trajectory, and each segment's tokens come from the weights of the segment's version."""

from __future__ import annotations

import io
from collections import defaultdict
from itertools import pairwise

import pytest
import torch
from rich.console import Console

from asyncrl.launch.launcher import run
from asyncrl.models.warm_start import load_policy
from asyncrl.ops.inspect_log import inspect_topic
from asyncrl.schemas import control as ev
from tests.helpers import check_log_invariants, read_topic, token_logprob_errors

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STEPS = 6
# Two samples at a time and 40 ms per decoding step: a sync (after every 8 samples) finds the
# worker in the middle of a group, so generations really are interrupted.
MODE_D = [
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.partial_rollout=true",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=2",
    "actor_rollout_ref.rollout.emulated_decode_latency_s=0.04",
    "trainer.test_freq=0",
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=1",
    f"trainer.keep_checkpoints={STEPS + 1}",
]


def _weights(cfg, version: int) -> dict:
    if version == 0:
        return load_policy(cfg)[0].state_dict()
    path = cfg.run_dir / "checkpoints" / f"step_{version:06d}" / "model.pt"
    return torch.load(path, weights_only=True)


def test_interrupted_samples_continue_under_the_new_weights(make_run_cfg, demo_policy):
    # The demo's warm start: rewards vary within groups, so every step really moves the weights.
    cfg = make_run_cfg(*demo_policy, *MODE_D)
    run(cfg, Console(file=io.StringIO(), width=120))

    partials = [r.value for r in read_topic(cfg, "partials")]
    samples = {r.value.sample_id: r.value for r in read_topic(cfg, "samples")}
    assert partials, "no sync interrupted a generation"
    events = [r.value for r in read_topic(cfg, "control")]
    paused = [e for e in events if isinstance(e, ev.RolloutPaused)]
    assert sum(e.n_partial for e in paused) == len(partials)
    # Every interrupted sample is accounted for once: finished, or dropped with a reason.
    dropped = [sid for e in events if isinstance(e, ev.SamplesDropped) for sid in e.sample_ids]
    assert len(dropped) == len(set(dropped))
    assert not set(dropped) & set(samples)
    assert {p.sample.sample_id for p in partials} <= set(samples) | set(dropped)

    # Every logged partial is continued: the final trajectory extends the logged tokens, and
    # the interrupted segment's version is where the next segment starts from.
    chains = defaultdict(list)
    for p in partials:
        chains[p.sample.sample_id].append(p)
    continued = 0
    for sample_id, chain in chains.items():
        final = samples.get(sample_id)
        if final is None:
            continue  # interrupted again at the last sync of the run
        for p in chain:
            for i in p.interrupted:
                cut, done = p.sample.trajectories[i], final.trajectories[i]
                n = len(cut.response_ids)
                assert done.response_ids[:n].tolist() == cut.response_ids.tolist()
                assert done.response_logprobs[:n].tolist() == cut.response_logprobs.tolist()
                assert done.param_version > p.interrupted_at_version or (
                    done.segment_starts[-1] == 0  # nothing had been generated before the cut
                )
                continued += 1
    assert continued > 0

    _check_segment_logprobs(cfg, samples)

    # `asyncrl inspect samples` shows the chain: a trajectory's segments with their versions.
    out = io.StringIO()
    rows = inspect_topic(
        cfg, cfg.kafka.bootstrap_servers, "samples", Console(file=out), as_json=True
    )
    chains = [seg for r in rows if "segments" in r for seg in r["segments"] if len(seg) > 1]
    assert chains and all(a["version"] < b["version"] for seg in chains for a, b in pairwise(seg))
    assert all(sum(s["tokens"] for s in seg) > 0 for seg in chains)
    # `inspect partials --text`: each cut sample with its prompt, as a sample's row has it
    cut = inspect_topic(
        cfg, cfg.kafka.bootstrap_servers, "partials", Console(file=out), as_json=True, text=True
    )
    assert cut and all(r["prompt"].endswith("=") for r in cut)

    steps = [r.value for r in read_topic(cfg, "steps")]
    assert sum(x.metrics["fully_async/partial/total_partial_num"] for x in steps) > 0
    assert max(x.metrics["fully_async/partial/max_partial_span"] for x in steps) >= 1


def _check_segment_logprobs(cfg, samples: dict) -> None:
    # Every token's logprob is the one its segment's weights give. To show that the check tells
    # versions apart, tokens are also scored with the weights of the trajectory's other end
    # (taken over all checked tokens: a near-certain token scores alike under both).
    spanning = [(s, t) for s in samples.values() for t in s.trajectories if t.span > 0]
    assert spanning, "no finished trajectory spans two weight versions"
    apart = 0.0
    for s, t in spanning[:32]:  # enough that some token is not near-certain (see apart)
        versions = t.token_versions().tolist()
        for v in sorted(set(versions)):
            errors = token_logprob_errors(cfg, _weights(cfg, v), s.prompt_ids, t)
            mine = [e for e, tv in zip(errors, versions, strict=True) if tv == v]
            assert max(mine) < 2e-4, f"{s.sample_id}: tokens of version {v} do not match"
        # Scored with the other end's weights, the first and last segments' tokens differ.
        first, last = min(versions), max(versions)
        for weights_of, tokens_of in ((first, last), (last, first)):
            errors = token_logprob_errors(cfg, _weights(cfg, weights_of), s.prompt_ids, t)
            apart = max(
                apart, *(e for e, tv in zip(errors, versions, strict=True) if tv == tokens_of)
            )
    assert apart > 1e-3


def test_an_in_flight_update_swaps_weights_between_tokens_without_pausing(
    make_run_cfg, demo_policy
):
    # No partials, no pause: the worker receives each version on a thread and swaps it in
    # between two tokens. Each token's logprob must still be its own segment's version's.
    cfg = make_run_cfg(*demo_policy, *MODE_D, "async_training.in_flight_update=true")
    run(cfg, Console(file=io.StringIO(), width=120))

    samples = {r.value.sample_id: r.value for r in read_topic(cfg, "samples")}
    assert not read_topic(cfg, "partials")  # nothing logged at a sync
    events = [r.value for r in read_topic(cfg, "control")]
    published = [e for e in events if isinstance(e, ev.WeightsPublished) and e.version > 0]
    assert len(published) == STEPS - 1 and all(e.pause_wait_s < 0.1 for e in published)
    paused = [e for e in events if isinstance(e, ev.RolloutPaused)]
    loaded = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    assert [e.version for e in paused] == [e.version for e in published]  # one swap per sync
    assert all(e.n_partial == 0 and e.pause_s < 0.5 for e in paused)
    assert all(e.checksum_ok for e in loaded)
    _check_segment_logprobs(cfg, samples)
    check_log_invariants(cfg)
