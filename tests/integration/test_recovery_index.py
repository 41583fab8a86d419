"""What a restarting worker reads from the log: the samples already on ``samples`` and the
newest partial of each unfinished one. (What it does with a redelivered prompt, skip or
continue it, is tests/unit/producers/test_worker_loop.py's.)"""

from __future__ import annotations

import pytest

from asyncrl.kafka import Publisher
from asyncrl.kafka.records import log_scan
from asyncrl.producers.recovery import RecoveryIndex
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.partial import TAG as PARTIAL_TAG
from asyncrl.schemas.partial import PartialSample, encode_partial
from asyncrl.schemas.sample import (
    NO_SIGNAL_HEADER,
    WORKER_HEADER,
    Sample,
    Trajectory,
    encode_sample,
)
from asyncrl.schemas.sample import TAG as SAMPLE_TAG

pytestmark = [pytest.mark.kafka]


def _sample(sample_id: str, worker: int, tokens: int, finish: str = "stop") -> Sample:
    prompt = [1, 5, 14, 6, 17]
    trajs = [
        Trajectory([4 + k for k in range(tokens)], [-0.5] * tokens, 0.0, finish_reason=finish)
        for _ in range(2)
    ]
    return Sample(sample_id, sample_id.split("@")[0], worker, prompt, "11", trajs)


def test_index_reads_published_samples_and_newest_unfinished_partials(run_cfg):
    scan = log_scan(run_cfg, run_cfg.kafka.bootstrap_servers)
    with Publisher(run_cfg.kafka, run_cfg.kafka.bootstrap_servers) as pub:
        for sid, worker in (("a@0", 0), ("b@0", 1), ("c@0", 0)):
            headers = {SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: str(worker)}
            if sid == "c@0":  # a group dynamic sampling leaves out: its slot was taken back
                headers[NO_SIGNAL_HEADER] = "1"
            pub.publish(
                run_cfg.topic("samples"), sid, encode_sample(_sample(sid, worker, 2)), headers
            )
        for sid, tokens in (("a@0", 1), ("d@0", 1), ("d@0", 3), ("e@0", 2)):
            part = PartialSample(_sample(sid, 0, tokens, "abort"), 0, 0, 0)
            pub.publish(
                run_cfg.topic("partials"), sid, encode_partial(part), {SCHEMA_HEADER: PARTIAL_TAG}
            )
    index = RecoveryIndex.from_log(scan)
    assert index.published == {"a@0", "b@0", "c@0"}
    assert index.produced == {0: 2, 1: 1}
    assert index.no_signal == {0: 1}  # a restarted worker 0 counts 1 of its 2 as not stale
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
    scan = log_scan(run_cfg, run_cfg.kafka.bootstrap_servers)
    _publish(run_cfg, samples=["a@0"], partials=[("b@0", 1), ("c@0", 1)])
    index = RecoveryIndex.from_log(scan)
    assert set(index.partials) == {"b@0", "c@0"}
    scanned = sum(index.positions["samples"].values()) + sum(index.positions["partials"].values())
    assert scanned == 3

    # Another worker publishes b and logs a longer partial of c, and a new one of d.
    _publish(run_cfg, samples=["b@0"], partials=[("c@0", 3), ("d@0", 2)])
    newer = RecoveryIndex.from_log(scan, after=index.positions)
    assert newer.published == {"b@0"} and set(newer.partials) == {"c@0", "d@0"}  # only the new
    index.rescan(scan)
    assert index.published == {"a@0", "b@0"}
    assert set(index.partials) == {"c@0", "d@0"}  # b finished: its partial is dropped
    assert len(index.partials["c@0"].sample.trajectories[0].response_ids) == 3  # the newest

    # Nothing new: a rescan reads nothing and changes nothing.
    before = (dict(index.positions["samples"]), dict(index.positions["partials"]))
    assert not RecoveryIndex.from_log(scan, after=index.positions).positions
    index.rescan(scan)
    assert (index.positions["samples"], index.positions["partials"]) == before


def test_a_record_that_does_not_decode_is_not_taken_for_its_sample(run_cfg):
    """A record the trainer dead-letters stood, by its key alone, for a sample on the log: a
    restarted worker skipped that prompt for good (``audit``: lost_prompts). A malformed worker
    header (``b"zz"``) stopped every restarted worker at start-up with a ValueError."""
    scan = log_scan(run_cfg, run_cfg.kafka.bootstrap_servers)
    with Publisher(run_cfg.kafka, run_cfg.kafka.bootstrap_servers) as pub:
        pub.publish(run_cfg.topic("samples"), "a@0", b"corrupt")
        pub.publish(
            run_cfg.topic("samples"),
            "junk@0",
            b"junk",
            {SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: "zz"},
        )
    _publish(run_cfg, samples=["b@0"])
    index = RecoveryIndex.from_log(scan)
    assert index.published == {"b@0"} and index.produced == {0: 1}
    assert not index.already_published("a@0")  # its prompt is generated, not skipped
