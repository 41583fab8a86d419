"""librdkafka's log lines through Python logging: rate-limited, except the debug lines a user
asks for with ``kafka.extra.debug`` (they were invisible: logged at DEBUG, one per facility
every few seconds)."""

import logging

from asyncrl.config import load_config
from asyncrl.kafka.health import _BrokerHealth

FMT = "%s [%s] %s"


def _lines(kafka_cfg, caplog) -> list[str]:
    logger = _BrokerHealth.of(kafka_cfg, "127.0.0.1:9").callbacks()["logger"]
    with caplog.at_level(logging.INFO, logger="asyncrl.kafka.health"):
        for i in range(5):
            logger.log(logging.DEBUG, FMT, "CGRPJOINSTATE", "rdkafka#consumer-1", f"state {i}")
        logger.log(logging.WARNING, FMT, "FAIL", "rdkafka#consumer-1", "connect failed")
        logger.log(logging.WARNING, FMT, "FAIL", "rdkafka#consumer-1", "connect failed again")
    return [r.getMessage() for r in caplog.records]


def test_debug_lines_asked_for_are_all_logged(caplog):
    cfg = load_config(overrides=["kafka.extra.debug=cgrp"])
    lines = _lines(cfg.kafka, caplog)
    assert [line for line in lines if "CGRPJOINSTATE" in line] == [
        f"librdkafka CGRPJOINSTATE [rdkafka#consumer-1] state {i}" for i in range(5)
    ]
    assert sum("connect failed" in line for line in lines) == 2


def test_without_debug_lines_are_rate_limited_and_debug_stays_quiet(caplog):
    lines = _lines(load_config().kafka, caplog)
    assert not [line for line in lines if "CGRPJOINSTATE" in line]
    assert sum("connect failed" in line for line in lines) == 1  # one per kind at a time
