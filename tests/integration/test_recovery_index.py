"""What a restarting worker reads from the log, and what it does with a redelivered prompt:
skip it if its sample is already on ``samples``, continue it if a partial of it is logged."""

from __future__ import annotations

import time

import pytest

from asyncrl.kafka import Publisher
from asyncrl.producers.feed import feed_prompts
from asyncrl.producers.prompt_source import PromptSource
from asyncrl.producers.recovery import WORKER_HEADER, RecoveryIndex
from asyncrl.producers.worker import RolloutWorker
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.partial import TAG as PARTIAL_TAG
from asyncrl.schemas.partial import PartialSample, encode_partial
from asyncrl.schemas.sample import TAG as SAMPLE_TAG
from asyncrl.schemas.sample import Sample, Trajectory, encode_sample
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka]


def _sample(sample_id: str, worker: int, tokens: int, finish: str = "stop") -> Sample:
    prompt = [1, 5, 14, 6, 17]
    trajs = [
        Trajectory([4 + k for k in range(tokens)], [-0.5] * tokens, 0.0, finish_reason=finish)
        for _ in range(2)
    ]
    return Sample(sample_id, sample_id.split("@")[0], worker, prompt, "11", trajs)


def test_index_reads_published_samples_and_newest_unfinished_partials(run_cfg):
    bootstrap = run_cfg.kafka.bootstrap_servers
    with Publisher(run_cfg.kafka, bootstrap) as pub:
        for sid, worker in (("a@0", 0), ("b@0", 1), ("c@0", 0)):
            headers = {SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: str(worker)}
            pub.publish(
                run_cfg.topic("samples"), sid, encode_sample(_sample(sid, worker, 2)), headers
            )
        for sid, tokens in (("a@0", 1), ("d@0", 1), ("d@0", 3), ("e@0", 2)):
            part = PartialSample(_sample(sid, 0, tokens, "abort"), 0, 0, 0)
            pub.publish(
                run_cfg.topic("partials"), sid, encode_partial(part), {SCHEMA_HEADER: PARTIAL_TAG}
            )
    index = RecoveryIndex.from_log(run_cfg, bootstrap)
    assert index.published == {"a@0", "b@0", "c@0"}
    assert index.produced == {0: 2, 1: 1}
    assert set(index.partials) == {"d@0", "e@0"}  # a@0 finished after its partial
    assert len(index.partials["d@0"].sample.trajectories[0].response_ids) == 3  # newest wins
    assert index.take_partial("d@0") is not None and index.take_partial("d@0") is None
    assert index.resumed == 1


def _publish(cfg, samples=(), partials=()):
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        for sid in samples:
            headers = {SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: "0"}
            pub.publish(cfg.topic("samples"), sid, encode_sample(_sample(sid, 0, 2)), headers)
        for sid, tokens in partials:
            part = encode_partial(PartialSample(_sample(sid, 0, tokens, "abort"), 0, 0, 0))
            pub.publish(cfg.topic("partials"), sid, part, {SCHEMA_HEADER: PARTIAL_TAG})


def test_a_rescan_reads_only_what_was_appended_and_keeps_the_newest_state(run_cfg):
    bootstrap = run_cfg.kafka.bootstrap_servers
    _publish(run_cfg, samples=["a@0"], partials=[("b@0", 1), ("c@0", 1)])
    index = RecoveryIndex.from_log(run_cfg, bootstrap)
    assert set(index.partials) == {"b@0", "c@0"}
    scanned = sum(index.positions["samples"].values()) + sum(index.positions["partials"].values())
    assert scanned == 3

    # Another worker publishes b and logs a longer partial of c, and a new one of d.
    _publish(run_cfg, samples=["b@0"], partials=[("c@0", 3), ("d@0", 2)])
    newer = RecoveryIndex.from_log(run_cfg, bootstrap, after=index.positions)
    assert newer.published == {"b@0"} and set(newer.partials) == {"c@0", "d@0"}  # only the new
    index.rescan(run_cfg, bootstrap)
    assert index.published == {"a@0", "b@0"}
    assert set(index.partials) == {"c@0", "d@0"}  # b finished: its partial is dropped
    assert len(index.partials["c@0"].sample.trajectories[0].response_ids) == 3  # the newest

    # Nothing new: a rescan reads nothing and changes nothing.
    before = (dict(index.positions["samples"]), dict(index.positions["partials"]))
    assert not RecoveryIndex.from_log(run_cfg, bootstrap, after=index.positions).positions
    index.rescan(run_cfg, bootstrap)
    assert (index.positions["samples"], index.positions["partials"]) == before


def test_redelivered_prompts_are_skipped_or_continued(make_run_cfg, quick_policy):
    cfg = make_run_cfg(
        *quick_policy,
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.max_concurrent_samples=8",
    )
    bootstrap = cfg.kafka.bootstrap_servers
    feed_prompts(cfg, bootstrap, count=5)
    ids = [r.value.sample_id for r in read_topic(cfg, "prompts")]
    logged = _sample(ids[3], 0, 2, "abort")
    logged.prompt_ids = [1, 5, 14, 6, 17]
    logged.trajectories[0].finish_reason = "stop"  # one finished, one cut short

    worker = RolloutWorker(cfg, 0, bootstrap)
    prompts = PromptSource(cfg, bootstrap)
    try:
        worker.recovery = RecoveryIndex(
            published={ids[0], ids[2]}, partials={ids[3]: PartialSample(logged, 0, 0, 3)}
        )
        worker.budget.reset(0, 0)
        deadline = time.monotonic() + 30  # the group join takes a few seconds
        # Until all five prompts are taken: the prompts topic has several partitions, so they
        # may come in any order (the third sample can start before a prompt to skip is seen).
        taken = lambda: len(worker.in_flight) + worker.recovery.skipped  # noqa: E731
        while taken() < 5 and time.monotonic() < deadline:
            worker._admit(prompts)
        assert set(worker.in_flight) == {ids[1], ids[3], ids[4]}
        assert worker.recovery.skipped == 2 and worker.recovery.resumed == 1
        assert worker.budget.started == 3  # skipped prompts cost no budget
        # The logged sample keeps its finished trajectory; only the cut one is generating,
        # as a continuation of its logged tokens.
        resumed = worker.in_flight[ids[3]]
        assert set(resumed.done) == {0} and resumed.segments[1][0] == [0, 2]
        assert worker.engine.num_active == 2 * 2 + 1  # two fresh samples of n=2, one continuation
        assert prompts.in_progress == 3  # the skipped two were marked done
    finally:
        prompts.close()
        worker.engine.abort_all()
        worker.control.close()
