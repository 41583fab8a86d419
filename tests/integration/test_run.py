"""Whole runs on the real broker: a trainer and rollout workers as real processes.

What is checked is read back from the run's own log (samples, control, steps topics), the
way an operator would check it.
"""

from __future__ import annotations

import io
from collections import Counter, defaultdict

import pytest
import torch
from rich.console import Console

from asyncrl.config import RunConfig
from asyncrl.launch.launcher import run
from asyncrl.schemas import control as ev
from tests.helpers import SMALL, read_topic, sample_logprob_error

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _run(cfg: RunConfig) -> dict:
    return run(cfg, Console(file=io.StringIO(), width=120))


def _samples_per_version(cfg: RunConfig) -> Counter:
    samples = read_topic(cfg, "samples")
    return Counter(r.value.param_version for r in samples)


def _control(cfg: RunConfig) -> list[ev.ControlEvent]:
    return [r.value for r in read_topic(cfg, "control")]


@pytest.mark.parametrize(
    "mode_overrides, steps",
    [
        (
            [
                "async_training.staleness_threshold=0",
                "async_training.trigger_parameter_sync_step=1",
            ],
            4,
        ),
        (
            [
                "async_training.staleness_threshold=0",
                "async_training.trigger_parameter_sync_step=2",
            ],
            6,
        ),
        (
            [
                "async_training.staleness_threshold=0.5",
                "async_training.trigger_parameter_sync_step=1",
            ],
            6,
        ),
    ],
    ids=["a-on-policy", "b-stream-off-policy", "c-stale-samples"],
)
def test_budget_never_exceeded_per_version(make_run_cfg, quick_policy, mode_overrides, steps):
    cfg = make_run_cfg(
        *SMALL, *mode_overrides, *quick_policy, f"trainer.total_training_steps={steps}"
    )
    summary = _run(cfg)
    assert summary["step"] == steps

    per_version = _samples_per_version(cfg)
    events = _control(cfg)
    resumed = {e.version: e for e in events if isinstance(e, ev.RolloutResumed)}
    last_version = max(per_version)
    for version, count in per_version.items():
        assert count <= cfg.max_samples_per_version, (version, count)
        assert count <= resumed[version].budget, (version, count, resumed[version])
        assert resumed[version].budget + resumed[version].num_stale <= cfg.max_samples_per_version
        if cfg.async_training.staleness_threshold == 0 and version < last_version:
            # Synchronous streaming: exactly trigger x required samples per version.
            assert count == cfg.samples_per_version, (version, count)

    steps_log = [r.value for r in read_topic(cfg, "steps")]
    stale = steps_log[-1].metrics["fully_async/count/stale_samples_processed"]  # a running total
    if cfg.async_training.staleness_threshold == 0:
        assert stale == 0
    else:
        assert stale > 0, "mode (c) should train on some samples of the previous version"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_one_gpu_for_both_roles(make_run_cfg, demo_policy):
    """Trainer and worker on the same GPU: every version reaches the worker bit for bit
    (from the second sync on through the trainer's GPU memory: docs/design.md)."""
    cfg = make_run_cfg(
        *SMALL,
        *demo_policy,
        "trainer.device=cuda",
        "actor_rollout_ref.rollout.device=cuda",
        "async_training.staleness_threshold=0.5",
        "trainer.total_training_steps=4",
    )
    _run(cfg)
    loaded = [e for e in _control(cfg) if isinstance(e, ev.WeightsLoaded)]
    assert sorted(e.version for e in loaded) == [0, 1, 2, 3]
    assert all(e.checksum_ok for e in loaded)
    assert _samples_per_version(cfg)


def test_versions_match_weights_and_syncs_are_bit_exact(make_run_cfg, demo_policy):
    """Two workers; every sample's logprobs match the weights of its param_version."""
    cfg = make_run_cfg(
        *SMALL,
        *demo_policy,  # rewards vary within groups, so every step moves the weights
        "actor_rollout_ref.rollout.num_workers=2",
        "async_training.staleness_threshold=0.5",
        "trainer.total_training_steps=4",
        "trainer.save_freq=1",
        "trainer.keep_checkpoints=10",
    )
    _run(cfg)

    events = _control(cfg)
    published = [e for e in events if isinstance(e, ev.WeightsPublished)]
    loaded = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    # Each worker is sent the weights when it joins, then 3 syncs reach both (the last step
    # ends the run); every transfer names the incarnations it reached.
    joins = [e for e in published if len(e.incarnations) == 1]
    syncs = [e for e in published if len(e.incarnations) == 2]
    assert [e.version for e in joins] == [0, 0] and len(set(e.incarnations[0] for e in joins)) == 2
    assert [e.version for e in syncs] == [1, 2, 3]
    assert all(set(e.incarnations) == {j.incarnations[0] for j in joins} for e in syncs)
    assert Counter(e.version for e in loaded) == {v: 2 for v in range(4)}
    assert all(e.checksum_ok for e in loaded)

    samples = [r.value for r in read_topic(cfg, "samples")]
    assert {s.worker_id for s in samples} == {0, 1}
    by_version = defaultdict(list)
    for s in samples:
        by_version[s.param_version].append(s)
    checked, apart = 0, 0.0
    for version, group in sorted(by_version.items()):
        if version == 0:
            continue  # version 0 is the warm start, which the trainer did not checkpoint
        weights = torch.load(
            cfg.run_dir / "checkpoints" / f"step_{version:06d}" / "model.pt", weights_only=True
        )
        other = torch.load(
            cfg.run_dir
            / "checkpoints"
            / f"step_{version - 1 if version > 1 else 2:06d}"
            / "model.pt",
            weights_only=True,
        )
        for s in group[:2]:
            assert sample_logprob_error(cfg, weights, s) < 2e-4
            # The check can tell versions apart (over all samples: a confident sample may
            # score almost alike under two neighbouring versions).
            apart = max(apart, sample_logprob_error(cfg, other, s))
            checked += 1
    assert checked >= 2
    assert apart > 1e-3


def test_bf16_workers_verify_the_cast_weights_of_every_version(make_run_cfg, demo_policy):
    """rollout.dtype=bfloat16 under a float32 trainer: each WeightsPublished carries the
    checksum of the trainer's weights cast to bf16 (the checkpoint of that step, cast, hashes
    to it), half the float32 bytes move, and every worker's load verifies."""
    from asyncrl.sync.checksum import weights_checksum

    cfg = make_run_cfg(
        *SMALL,
        *demo_policy,
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "async_training.staleness_threshold=0.5",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.keep_checkpoints=10",
    )
    _run(cfg)
    events = _control(cfg)
    loaded = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    assert sorted(e.version for e in loaded) == [0, 1, 2] and all(e.checksum_ok for e in loaded)
    published = {e.version: e for e in events if isinstance(e, ev.WeightsPublished)}
    for version in (1, 2):
        weights = torch.load(
            cfg.run_dir / "checkpoints" / f"step_{version:06d}" / "model.pt", weights_only=True
        )
        assert published[version].checksum == weights_checksum(weights, dtype=torch.bfloat16)
        assert published[version].checksum != weights_checksum(weights)
        float32_bytes = sum(t.numel() * 4 for n, t in weights.items() if n != "lm_head.weight")
        assert published[version].bytes <= float32_bytes // 2 + 1024
