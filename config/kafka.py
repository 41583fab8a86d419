"""The ``kafka`` section: brokers, topics and their partitions, message sizes, security."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from asyncrl.config.base import MAX_WAIT_S, Strict

DEFAULT_PARTITIONS = {
    "prompts": 4,
    "samples": 1,
    "partials": 1,
    "control": 1,
    "steps": 1,
    "dead-letter": 1,
}


class TopicsConfig(Strict):
    partitions: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: dict(DEFAULT_PARTITIONS)
    )
    """Partition count per topic (at least 1), created explicitly (Tansu would auto-create 4).
    Setting one (kafka.topics.partitions.prompts=8) keeps the defaults of the others."""

    @field_validator("partitions", mode="before")
    @classmethod
    def _merge_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        unknown = set(value) - set(DEFAULT_PARTITIONS)
        if unknown:
            raise ValueError(
                f"unknown topic(s) {sorted(unknown)}; known: {sorted(DEFAULT_PARTITIONS)}"
            )
        return {**DEFAULT_PARTITIONS, **value}


class KafkaSecurityConfig(Strict):
    """TLS and SASL to the brokers (docs/cluster.md). Secrets are never part of the config:
    name the environment variables that hold them, so config files, the resolved
    runs/<run_id>/config.yaml and logs never contain a password."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """librdkafka's security.protocol."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """SASL mechanism (needed with SASL_PLAINTEXT / SASL_SSL)."""
    sasl_username: str | None = None
    """SASL user name."""
    sasl_password_env: str = "KAFKA_SASL_PASSWORD"
    """Environment variable holding the SASL password (read by each process at start-up)."""
    ssl_ca_location: str | None = None
    """CA certificate file (PEM) to verify the brokers; unset: the system's CAs."""
    ssl_certificate_location: str | None = None
    """Client certificate (PEM), for mutual TLS."""
    ssl_key_location: str | None = None
    """Client private key (PEM), for mutual TLS."""
    ssl_key_password_env: str = "KAFKA_SSL_KEY_PASSWORD"
    """Environment variable holding the client key's password, if it has one."""
    ssl_verify_hostname: bool = True
    """Check the broker certificate's host name (ssl.endpoint.identification.algorithm)."""

    @model_validator(mode="after")
    def _check(self) -> KafkaSecurityConfig:
        sasl = self.protocol.startswith("SASL_")
        if sasl and (self.sasl_mechanism is None or not self.sasl_username):
            raise ValueError(
                f"security.protocol {self.protocol} needs kafka.security.sasl_mechanism and "
                "kafka.security.sasl_username"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(
                f"kafka.security.sasl_mechanism is set but protocol is {self.protocol} "
                "(use SASL_PLAINTEXT or SASL_SSL)"
            )
        return self


EMBEDDED_SESSION_TIMEOUT_MS = 2000
"""``kafka.session_timeout_ms`` when unset and ``asyncrl run`` starts the embedded broker."""
EXTERNAL_SESSION_TIMEOUT_MS = 6000
"""``kafka.session_timeout_ms`` when unset otherwise (Apache Kafka's minimum by default)."""

SECRET_HINTS = ("password", "secret", "token", "sasl.oauthbearer.config")


class KafkaConfig(Strict):
    bootstrap_servers: str | None = None
    """Kafka bootstrap servers. Unset: an embedded Tansu broker is started on a free loopback port."""
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Largest message we produce; checked client-side before sending (Tansu does not enforce it)."""
    session_timeout_ms: int | None = Field(None, ge=1000)
    """Consumer-group session timeout. Tansu answers a group join after about half of it
    (measured: ~1.1 s at 2000, ~3.1 s at 6000, ~23 s at librdkafka's 45000; and ~1.1 s at
    300-1000 too: a shorter one gains nothing), so unset it is
    2000 on the embedded broker (asyncrl run starting Tansu itself) and 6000 elsewhere (Apache
    Kafka refuses less than its group.min.session.timeout.ms, 6000 by default)."""
    heartbeat_interval_ms: int = Field(500, ge=100)
    """Consumer-group heartbeat interval."""
    max_poll_interval_ms: int = Field(7000, ge=1000)
    """Max time between polls; also the rebalance timeout, which bounds the join time."""
    linger_ms: int = Field(5, ge=0)
    """Producer batching delay."""
    fetch_wait_max_ms: int = Field(20, ge=1)
    """Longest a consumer's fetch waits at the broker for new data. Tansu does not answer a
    waiting fetch when data arrives, so this bounds every hop's latency there (median hop
    25 ms at 100, 5.5 ms at 20); Apache Kafka answers at once, so a larger value (librdkafka's
    default is 500) only cuts idle requests."""
    broker_down_timeout_s: float = Field(15.0, gt=0, le=MAX_WAIT_S)
    """How long every broker may stay unreachable before a client gives up with
    BrokerUnavailable (naming kafka.bootstrap_servers), instead of retrying quietly: a dead
    broker then ends a flush or a poll within this bound, not after librdkafka's timeouts."""
    extra: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Raw librdkafka settings applied last to every client (no secrets: see security).
    ``debug`` (e.g. ``kafka.extra.debug=cgrp``) logs every librdkafka debug line at INFO."""
    topics: TopicsConfig = Field(default_factory=TopicsConfig)
    security: KafkaSecurityConfig = Field(default_factory=KafkaSecurityConfig)

    @model_validator(mode="after")
    def _no_secrets_in_extra(self) -> KafkaConfig:
        for key in self.extra:
            if any(hint in key.lower() for hint in SECRET_HINTS):
                raise ValueError(
                    f"kafka.extra.{key}: secrets do not go in the config (it is written to "
                    "runs/<run_id>/config.yaml); put it in an environment variable named by "
                    "kafka.security.sasl_password_env / ssl_key_password_env"
                )
        return self
