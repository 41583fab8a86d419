"""A Reader's errors that come through librdkafka's error callback rather than a message."""

import pytest
from confluent_kafka import KafkaError

from asyncrl.config import load_config
from asyncrl.kafka import Reader, UnknownTopic, raw_decode


def test_an_assigned_topic_the_broker_lost_stops_the_reader_naming_it():
    """A standalone broker restarted under a role-by-role run: the worker (a group member)
    stopped on one line naming the topic, but the trainer, whose samples and control
    partitions are assigned, only logged librdkafka's error callback every 10 s and waited
    for samples for good (a SIGTERM then ended it in a traceback of a failed commit)."""
    bootstrap = "127.0.0.1:9"  # nothing listens: the consumer is built, never reached
    with Reader(load_config().kafka, bootstrap, raw_decode) as reader:
        assert reader.poll(0) == []
        error_cb = reader._health.callbacks()["error_cb"]
        error_cb(
            KafkaError(
                KafkaError.UNKNOWN_TOPIC_OR_PART,
                "demo.samples [0]: topic does not exist (Broker: Unknown topic or partition)",
            )
        )
        with pytest.raises(UnknownTopic) as exc:
            reader.poll(0)
    assert str(exc.value).startswith(f"topic demo.samples is gone from the broker at {bootstrap} ")
