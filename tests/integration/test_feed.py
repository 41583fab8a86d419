"""The prompt feed is idempotent: set-up run again (a restarted ``asyncrl run`` with the same
run id, or a set-up interrupted half-way) never puts a prompt on the topic twice."""

from __future__ import annotations

from collections import Counter

import pytest

from asyncrl.kafka import Publisher
from asyncrl.kafka.records import read_records
from asyncrl.producers.feed import feed_prompts
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.prompt import TAG, decode_prompt

pytestmark = pytest.mark.kafka


def test_feeding_again_writes_only_the_prompts_not_there_yet(run_cfg):
    bootstrap = run_cfg.kafka.bootstrap_servers
    with Publisher(run_cfg.kafka, bootstrap) as pub:  # garbage is no prompt, and stays
        pub.publish(run_cfg.topic("prompts"), "junk", b"\x00junk", {SCHEMA_HEADER: TAG})
    run_cfg.data.train_size = 30  # 50 prompts span two epochs: prompt ids repeat
    assert feed_prompts(run_cfg, bootstrap, count=40) == (40, 0)
    assert feed_prompts(run_cfg, bootstrap, count=40) == (0, 40)  # a restart: nothing new
    assert feed_prompts(run_cfg, bootstrap, count=50) == (10, 40)  # a longer run: the rest

    records = list(read_records(run_cfg, bootstrap, "prompts"))
    assert len(records) == 51
    fed = [decode_prompt(r.value) for r in records if r.key != "junk"]
    assert len({p.sample_id for p in fed}) == 50
    assert Counter(p.epoch for p in fed) == {0: 30, 1: 20}
