"""Deleting a run's topics (``kafka/topics.py``) while this process reads them."""

import pytest

from asyncrl.config import load_config
from asyncrl.kafka import Reader, raw_decode
from asyncrl.kafka.reader import topics_read_here
from asyncrl.kafka.topics import delete_run_topics


def test_a_runs_topics_are_not_deleted_while_a_reader_here_reads_them():
    """librdkafka crashes the process (SIGSEGV, no traceback) when a topic one of its consumers
    is subscribed to or assigned is deleted under it. delete_run_topics refuses, naming the
    topic, before it asks the broker; once the reader is closed its topics are free."""
    cfg = load_config(overrides=["run_id=gone"])
    bootstrap = "127.0.0.1:9"  # nothing listens: the refusal comes before any request
    reader = Reader(cfg.kafka, bootstrap, raw_decode, group_id="gone.rollout")
    try:
        reader.subscribe([cfg.topic("prompts")])
        assert cfg.topic("prompts") in topics_read_here()
        with pytest.raises(
            RuntimeError, match=r"^not deleting the topics of run 'gone': gone.prompts still read"
        ):
            delete_run_topics(cfg, bootstrap)
    finally:
        reader.close(leave_group=False)
    assert cfg.topic("prompts") not in topics_read_here()
