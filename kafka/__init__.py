"""The Kafka client layer: thin typed wrappers over confluent-kafka (one Publisher, one Reader,
one config mapping), topic admin, and reading a topic back.

Every process talks to Kafka through these, so our config names map to librdkafka keys in
exactly one place (``client_config`` and friends). The sync ``Producer`` is used on purpose:
headers travel with it, and a delivery error is surfaced at ``flush``. Undecodable messages
never stop a reader: they go to the run's dead-letter topic with the reason attached.

Dead letters and commits, in this order. A bad record's copy is *published* when it is read
(``on_acked`` marks its offset copied); a commit, synchronous or not, is capped at the lowest
offset whose copy is not acknowledged yet, so a crash in between re-reads the bad record
instead of losing it; the acknowledgement then redoes a capped commit up to where it was
asked (a copy whose delivery fails keeps the commit below it for good, and the publisher's
next flush or check raises the failure). Nothing here flushes or polls a producer from inside one of its own delivery callbacks
(the worker commits prompts from the sample's ``on_acked``, and the dead-letter copies travel
on the same producer): librdkafka cannot serve a flush there, it waited 30 s and then failed
or aborted. Only a synchronous commit from ordinary code flushes the copies first.

Faults. A consumer error that librdkafka recovers from by itself (max.poll.interval
exceeded: it rejoins the group on the next poll; transport errors; retriable ones) is logged,
rate-limited, and skipped; only the others raise. librdkafka's own log lines and error
callbacks go through Python logging, at most one line per kind per client every
``_LOG_EVERY_S`` (it wrote one "Connection refused" line per reconnect, ~20 a second, to
stderr). When every broker stays unreachable longer than ``kafka.broker_down_timeout_s`` (and
a metadata request confirms it), a flush, a poll or a metadata call raises
``BrokerUnavailable``, naming ``kafka.bootstrap_servers``, instead of retrying for minutes.

Modules: ``settings`` (config -> librdkafka keys), ``health`` (logging, broker down),
``record``, ``publisher``, ``reader``, ``dead_letters`` (a reader's decoding and dead-letter
copies, the commit order numbered), ``watermarks`` (exact log ends), ``topics`` (the run's
topics), ``records`` (a topic read back, start to end).
"""

from asyncrl.kafka.health import BrokerUnavailable, UnknownTopic, admin_client, client_callbacks
from asyncrl.kafka.publisher import KafkaDeliveryError, MessageTooLarge, Publisher
from asyncrl.kafka.reader import Reader
from asyncrl.kafka.record import (
    HEADER_ERROR,
    HEADER_REPLAYED_FROM,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
    Record,
    raw_decode,
)
from asyncrl.kafka.settings import (
    MissingSecret,
    client_config,
    consumer_config,
    producer_config,
    redacted,
    security_settings,
)
from asyncrl.kafka.watermarks import count_records, read_topics_watermarks, read_watermarks

__all__ = [
    "HEADER_ERROR",
    "HEADER_SOURCE_OFFSET",
    "HEADER_SOURCE_PARTITION",
    "HEADER_REPLAYED_FROM",
    "HEADER_SOURCE_TOPIC",
    "BrokerUnavailable",
    "KafkaDeliveryError",
    "MessageTooLarge",
    "MissingSecret",
    "Publisher",
    "Reader",
    "Record",
    "UnknownTopic",
    "admin_client",
    "client_callbacks",
    "client_config",
    "consumer_config",
    "count_records",
    "producer_config",
    "raw_decode",
    "read_topics_watermarks",
    "read_watermarks",
    "redacted",
    "security_settings",
]
