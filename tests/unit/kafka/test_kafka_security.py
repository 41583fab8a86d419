"""TLS/SASL pass through to librdkafka; secrets come from the environment and go nowhere else."""

import pytest
from confluent_kafka import Producer

from asyncrl.config import ConfigError, dump_config, load_config
from asyncrl.kafka import MissingSecret, client_config, redacted

SCRAM = [
    "kafka.security.protocol=SASL_SSL",
    "kafka.security.sasl_mechanism=SCRAM-SHA-512",
    "kafka.security.sasl_username=rl",
    "kafka.security.ssl_ca_location=/etc/kafka/ca.pem",
]


def test_sasl_ssl_settings_reach_librdkafka(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret-value")
    cfg = load_config(overrides=SCRAM)
    conf = client_config(cfg.kafka, "kafka:9093")
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "rl" and conf["sasl.password"] == "s3cret-value"
    assert conf["ssl.ca.location"] == "/etc/kafka/ca.pem"
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    assert redacted(conf)["sasl.password"] == "***"
    # The secret is in no config the run writes or prints.
    dump_config(cfg, tmp_path / "config.yaml")
    assert "s3cret" not in (tmp_path / "config.yaml").read_text()
    assert "s3cret" not in repr(cfg) and "s3cret" not in str(redacted(conf))


def test_librdkafka_accepts_the_sasl_settings(monkeypatch):
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "pw")
    cfg = load_config(
        overrides=[
            "kafka.security.protocol=SASL_PLAINTEXT",
            "kafka.security.sasl_mechanism=PLAIN",
            "kafka.security.sasl_username=rl",
        ]
    )
    Producer(client_config(cfg.kafka, "127.0.0.1:1"))  # raises KafkaException on a bad key


def test_missing_password_names_the_key(monkeypatch):
    monkeypatch.delenv("KAFKA_SASL_PASSWORD", raising=False)
    cfg = load_config(overrides=SCRAM)
    with pytest.raises(
        MissingSecret, match="kafka.security.sasl_password_env.*KAFKA_SASL_PASSWORD"
    ):
        client_config(cfg.kafka, "kafka:9093")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["kafka.security.protocol=SASL_SSL"], "sasl_mechanism"),
        (["kafka.security.sasl_mechanism=PLAIN"], "sasl_mechanism is set but protocol"),
        (["kafka.extra={sasl.password: x}"], "kafka.extra.sasl.password"),
    ],
)
def test_bad_security_config_fails_at_load(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config(overrides=overrides)
