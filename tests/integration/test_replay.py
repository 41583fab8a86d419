"""`asyncrl replay step`: a step re-run from the log reproduces what was recorded."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from asyncrl.config import load_config
from asyncrl.launch.launcher import run
from asyncrl.ops.replay import ReplayError, replay_step

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_step_replay_is_exact_and_a_changed_lr_differs(make_run_cfg, demo_policy):
    cfg = make_run_cfg(
        *demo_policy,
        "trainer.total_training_steps=4",
        "trainer.save_freq=1",
        "trainer.keep_checkpoints=10",
        "trainer.test_freq=0",
    )
    run(cfg, Console(file=io.StringIO()))
    bootstrap = cfg.kafka.bootstrap_servers
    # As a user would: the run's own resolved config, plus overrides.
    run_cfg = cfg.run_dir / "config.yaml"

    for step in (1, 3):
        same = replay_step(load_config(run_cfg), bootstrap, step, Console(file=io.StringIO()))
        assert same["weights_equal"], f"step {step}: max |diff| {same['weights_max_abs_diff']}"
        for key, m in same["metrics"].items():
            assert m["replayed"] == m["recorded"], key

    changed_cfg = load_config(run_cfg, ["actor_rollout_ref.actor.optim.lr=0.01"])
    changed = replay_step(changed_cfg, bootstrap, 3, Console(file=io.StringIO()))
    assert not changed["weights_equal"]
    assert changed["weights_max_abs_diff"] > 1e-4

    # Starting from the wrong state is refused (step 3 from step 1's checkpoint).
    (cfg.run_dir / "checkpoints" / "step_000002").rename(cfg.run_dir / "checkpoints" / "moved")
    (cfg.run_dir / "checkpoints" / "step_000001").rename(
        cfg.run_dir / "checkpoints" / "step_000002"
    )
    with pytest.raises(ReplayError, match="differ from those it started from"):
        replay_step(load_config(run_cfg), bootstrap, 3, Console(file=io.StringIO()))

    with pytest.raises(ReplayError, match="not on"):
        replay_step(load_config(run_cfg), bootstrap, 99, Console(file=io.StringIO()))


def test_topic_replay_delivers_exactly_the_selected_records_in_order(make_run_cfg, quick_policy):
    from asyncrl.ops.replay import replay_topic
    from tests.helpers import read_topic

    cfg = make_run_cfg(
        *quick_policy,
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=3",
        "trainer.test_freq=0",
    )
    run(cfg, Console(file=io.StringIO()))
    bootstrap = cfg.kafka.bootstrap_servers
    source = read_topic(cfg, "samples")
    target = cfg.model_copy(update={"run_id": f"{cfg.run_id}-replay"})

    n = replay_topic(cfg, bootstrap, "samples", target.run_id, Console(file=io.StringIO()), 2, 7)
    got = read_topic(target, "samples")
    assert n == 5
    assert [r.value.sample_id for r in got] == [r.value.sample_id for r in source[2:7]]
    replayed = {"replayed-from": cfg.topic("samples").encode()}  # its versions are cfg's
    assert [r.headers for r in got] == [{**r.headers, **replayed} for r in source[2:7]]

    picked = {source[0].value.sample_id, source[-1].value.sample_id}
    other = cfg.model_copy(update={"run_id": f"{cfg.run_id}-picked"})
    replay_topic(
        cfg, bootstrap, "samples", other.run_id, Console(file=io.StringIO()), sample_ids=picked
    )
    assert [r.value.sample_id for r in read_topic(other, "samples")] == [
        source[0].value.sample_id,
        source[-1].value.sample_id,
    ]

    newest = max(r.value.param_version for r in source)
    late = cfg.model_copy(update={"run_id": f"{cfg.run_id}-late"})
    replay_topic(
        cfg,
        bootstrap,
        "samples",
        late.run_id,
        Console(file=io.StringIO()),
        versions=(newest, newest),
    )
    assert [r.value.sample_id for r in read_topic(late, "samples")] == [
        r.value.sample_id for r in source if r.value.param_version == newest
    ]

    # From the run's archive (an `asyncrl run` whose broker ended with it) into a run on a
    # broker of its own: the source's broker was the only one before, and it was gone.
    from asyncrl.cli import main
    from asyncrl.launch.log_archive import Archiver

    Archiver(cfg, bootstrap).start().stop()
    command = ["replay", "topic", "samples", cfg.run_id, f"output_dir={cfg.output_dir}"]
    assert main([*command, "--to-run", "elsewhere"]) == 1  # names --to-bootstrap
    elsewhere = cfg.model_copy(update={"run_id": f"{cfg.run_id}-elsewhere"})
    assert main([*command, "--to-run", elsewhere.run_id, "--to-bootstrap", bootstrap]) == 0
    assert [r.value.sample_id for r in read_topic(elsewhere, "samples")] == [
        r.value.sample_id for r in source
    ]


def test_step_replay_is_exact_with_every_offpolicy_option_on(make_run_cfg, quick_policy, tmp_path):
    """Issue 17, point 5: decoupled PPO (proximal log-probs, token weights), rejection,
    stale-token masking and dynamic sampling, all on in a stale mode (d) run: each step
    replays bit for bit, the filtered groups are on the log and the audit is clean."""
    from asyncrl.ops.audit import audit_run
    from asyncrl.schemas import control as ev
    from tests.helpers import parity_reward, read_topic

    cfg = make_run_cfg(
        *quick_policy,
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "async_training.require_batches=2",
        "actor_rollout_ref.rollout.max_concurrent_samples=4",
        "actor_rollout_ref.rollout.emulated_decode_latency_s=0.01",
        "async_training.staleness_threshold=2",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.partial_rollout=true",
        "async_training.compute_prox_log_prob=true",
        "async_training.max_token_version_lag=0",  # every token of an older version
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=1.5",
        "algorithm.filter_groups.enable=true",
        parity_reward(tmp_path),
        "trainer.total_training_steps=5",
        "trainer.save_freq=1",
        "trainer.keep_checkpoints=10",
        "trainer.test_freq=0",
    )
    summary = run(cfg, Console(file=io.StringIO()))
    bootstrap = cfg.kafka.bootstrap_servers
    assert summary["step"] == 5 and summary["filtered"] > 0

    steps = [r.value for r in read_topic(cfg, "steps")]
    filtered = [
        e
        for e in (r.value for r in read_topic(cfg, "control"))
        if isinstance(e, ev.SamplesDropped) and e.reason.startswith("filter_groups")
    ]
    filtered_ids = {sid for e in filtered for sid in e.sample_ids}
    assert len(filtered_ids) == summary["filtered"]
    assert not filtered_ids & {sid for s in steps for sid in s.sample_ids}
    for s in steps:  # lag 0: a step masks tokens exactly when it trains a stale sample
        stale = s.metrics["fully_async/staleness/mean"] > 0
        masked = s.metrics["fully_async/stale_tokens/masked_ratio"]
        assert stale == (masked > 0), s.step
        # a step left with no token to train has nothing to correct (nor any update)
        assert ("rollout_corr/rollout_is_mean" in s.metrics) == (masked < 1), s.step
    report = audit_run(cfg, bootstrap)
    assert report.ok, report.to_dict()

    run_cfg = cfg.run_dir / "config.yaml"
    for step in range(1, 6):
        same = replay_step(load_config(run_cfg), bootstrap, step, Console(file=io.StringIO()))
        assert same["weights_equal"], f"step {step}: max |diff| {same['weights_max_abs_diff']}"
        for key, m in same["metrics"].items():
            assert m["replayed"] == m["recorded"], (step, key)
