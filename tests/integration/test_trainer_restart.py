"""A trainer stopped and restarted from its checkpoint consumes each sample exactly once,
and a message that does not decode goes to the dead-letter topic while training goes on."""

from __future__ import annotations

import pytest

from asyncrl.consumers.trainer import Trainer
from asyncrl.kafka import HEADER_ERROR, HEADER_SOURCE_OFFSET, Publisher
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import TAG, Sample, Trajectory, encode_sample
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

GARBAGE = b"\x00not an arrow stream"


TRAINER_ALONE = [
    "actor_rollout_ref.rollout.num_workers=0",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.total_training_steps=2",
    "trainer.save_freq=1",
    "trainer.test_freq=0",
]
"""A trainer fed by samples the test publishes: 4 a step, 2 steps, a checkpoint after each."""


def synthetic_sample(i: int) -> Sample:
    """A well-formed sample of the arithmetic task (the trainer really trains on it)."""
    prompt = [1, 4 + i % 10, 14, 4 + (i // 10) % 10, 17]  # <bos> d + d = (character ids)
    trajs = [
        Trajectory([4 + (i + j) % 10, 2], [-2.0, -0.5], float(j % 2), param_version=0)
        for j in range(4)
    ]
    return Sample(f"s{i}", f"p{i}", 0, prompt, "0", trajs)


def test_restart_consumes_each_sample_exactly_once(make_run_cfg, quick_policy):
    cfg = make_run_cfg(*quick_policy, *TRAINER_ALONE)
    topic = cfg.topic("samples")
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        for i in range(24):
            pub.publish(topic, f"s{i}", encode_sample(synthetic_sample(i)), {SCHEMA_HEADER: TAG})
            if i == 5:
                pub.publish(topic, "bad", GARBAGE, {SCHEMA_HEADER: TAG})

    first = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        assert first.run()["step"] == 2
    finally:
        first.close()

    cfg.trainer.total_training_steps = 5
    second = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        # Resumed, not restarted from zero; the first trainer published version 1 after step
        # 1, so the checkpoint's weights of step 2 become version 2, not a second version 1.
        assert second.step == 2 and second.version == 2
        assert second.run()["step"] == 5
    finally:
        second.close()

    steps = [r.value for r in read_topic(cfg, "steps")]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    used = [sid for s in steps for sid in s.sample_ids]
    assert used == [f"s{i}" for i in range(20)]  # in order, none twice, none skipped

    events = [r.value for r in read_topic(cfg, "control")]
    published = [(e.version, e.checksum) for e in events if isinstance(e, ev.WeightsPublished)]
    versions = [v for v, _ in published]
    assert versions == sorted(set(versions)), versions  # strictly increasing: none reused
    resumed = [e for e in events if isinstance(e, ev.TrainerResumed)]
    assert [(e.step, e.checkpoint_version, e.last_logged_version) for e in resumed] == [(2, 1, 1)]

    dead = read_topic(cfg, "dead-letter")
    assert len(dead) == 1  # routed once, not re-read after the restart
    assert dead[0].value == GARBAGE
    assert b"Arrow" in dead[0].headers[HEADER_ERROR]
    assert dead[0].headers[HEADER_SOURCE_OFFSET] == b"6"


def test_a_copied_sample_is_trained_once_and_a_wrong_schema_header_is_dead_lettered(
    make_run_cfg, quick_policy
):
    cfg = make_run_cfg(*quick_policy, *TRAINER_ALONE)
    topic = cfg.topic("samples")
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        for i in range(4):
            pub.publish(topic, f"s{i}", encode_sample(synthetic_sample(i)), {SCHEMA_HEADER: TAG})
        pub.publish(topic, "s1", encode_sample(synthetic_sample(1)), {SCHEMA_HEADER: TAG})  # copy
        pub.publish(topic, "s2", encode_sample(synthetic_sample(2)), {SCHEMA_HEADER: "sample/99"})
        for i in range(4, 9):
            pub.publish(topic, f"s{i}", encode_sample(synthetic_sample(i)), {SCHEMA_HEADER: TAG})

    trainer = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        assert trainer.run()["step"] == 2
        assert trainer.batcher.consumed == {0: 8}  # the copy is not counted as consumed
    finally:
        trainer.close()

    steps = [r.value for r in read_topic(cfg, "steps")]
    assert [sid for s in steps for sid in s.sample_ids] == [f"s{i}" for i in range(8)]
    assert steps[-1].metrics["fully_async/count/duplicate_samples"] == 1.0
    dead = read_topic(cfg, "dead-letter")
    assert len(dead) == 1 and b"sample/99" in dead[0].headers[HEADER_ERROR]
    dropped = [
        e
        for e in (r.value for r in read_topic(cfg, "control"))
        if type(e).__name__ == "SamplesDropped"
    ]
    assert [(e.sample_ids, e.target_worker) for e in dropped] == [(["s1"], -1)]


def test_a_trainer_that_fails_leaves_the_run_open(make_run_cfg, quick_policy):
    """A trainer that times out waiting for samples raises, and publishes no RunFinished: the
    workers keep waiting for a restarted trainer instead of stopping (it used to announce
    'total_training_steps reached')."""
    cfg = make_run_cfg(
        *quick_policy,
        "actor_rollout_ref.rollout.num_workers=0",
        "trainer.test_freq=0",
        "sync.timeout_s=1",
    )
    trainer = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        with pytest.raises(TimeoutError, match="samples arrived"):
            trainer.run()
    finally:
        trainer.close()
    events = [r.value for r in read_topic(cfg, "control")]
    assert not [e for e in events if isinstance(e, ev.RunFinished)]


def test_samples_an_update_would_fail_on_do_not_stop_the_trainer(make_run_cfg, quick_policy):
    """A schema-valid sample with a NaN reward (written by something else than our encoder)
    made the weights NaN; one with a token id past the vocabulary failed the update with an
    index error, and a restarted trainer read it again and failed again. The first is now
    dead-lettered, the second dropped (its worker refunded), and training goes on."""
    import pyarrow as pa

    from asyncrl.schemas.codec import encode_batch
    from asyncrl.schemas.sample import SCHEMA, sample_columns

    cfg = make_run_cfg(*quick_policy, *TRAINER_ALONE)
    topic = cfg.topic("samples")
    nan = synthetic_sample(100)
    nan.sample_id = "nan"
    nan.trajectories[0].reward = float("nan")
    oov = synthetic_sample(101)
    oov.sample_id = "oov"
    oov.trajectories[0].response_ids = [10**6, 2]
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        for i in range(8):
            if i == 3:
                forged = encode_batch(
                    pa.RecordBatch.from_pydict(sample_columns(nan), schema=SCHEMA)
                )
                pub.publish(topic, "nan", forged, {SCHEMA_HEADER: TAG})
                pub.publish(topic, "oov", encode_sample(oov), {SCHEMA_HEADER: TAG})
            pub.publish(topic, f"s{i}", encode_sample(synthetic_sample(i)), {SCHEMA_HEADER: TAG})

    trainer = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        assert trainer.run()["step"] == 2
        assert all(p.isfinite().all() for p in trainer.model.parameters())
    finally:
        trainer.close()

    steps = [r.value for r in read_topic(cfg, "steps")]
    assert [sid for s in steps for sid in s.sample_ids] == [f"s{i}" for i in range(8)]
    [dead] = read_topic(cfg, "dead-letter")
    assert dead.key == "nan" and b"not finite" in dead.headers[HEADER_ERROR]
    dropped = [
        e
        for e in (r.value for r in read_topic(cfg, "control"))
        if type(e).__name__ == "SamplesDropped"
    ]
    assert [(e.sample_ids, e.target_worker) for e in dropped] == [(["oov"], 0)]
    assert "outside the policy's vocabulary" in dropped[0].reason
