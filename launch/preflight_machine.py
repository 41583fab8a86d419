"""Start-up checks of the machine a process runs on: CUDA, installed extras, the tracing
exporter, the Kafka client settings and secrets, the rendezvous host."""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.launch.preflight_check import Check


def cuda_checks(cfg: RunConfig, role: str, here: bool) -> list[Check]:
    """The keys that need CUDA in the processes ``role`` starts (a worker does not need the
    trainer's GPU, nor the trainer a worker's)."""
    wants: dict[str, bool] = {}
    if role != "rollout":
        wants["trainer.device"] = cfg.trainer.device == "cuda"
        wants["sync.backend"] = cfg.sync.backend == "nccl"
    if role != "train":
        wants["actor_rollout_ref.rollout.device"] = cfg.actor_rollout_ref.rollout.device == "cuda"
    if not any(wants.values()):
        if role == "rollout":
            return []
        return [Check("trainer.device", True, f"{cfg.trainer.device} (no CUDA needed)")]
    if not here:
        return [
            Check(k, None, "checked by the trainer's or worker's own process (launcher=ray)")
            for k, want in wants.items()
            if want
        ]
    import torch

    available = torch.cuda.is_available()
    why = (
        f"{torch.cuda.device_count()} GPU(s)"
        if available
        else f"CUDA is not available here (torch {torch.__version__}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
    )
    value = {"sync.backend": "nccl"}
    return [
        Check(k, available, f"{value.get(k, 'cuda')}: {why}") for k, want in wants.items() if want
    ]


def package_check(key: str, module: str, extra: str) -> Check:
    if importlib.util.find_spec(module) is None:
        return Check(key, False, f"needs {module}: pip install 'asyncrl[{extra}]'")
    return Check(key, True, f"{module} is installed")


def tracing_check(cfg: RunConfig) -> Check:
    """The span exporter can be made (OTEL_TRACES_EXPORTER names one asyncrl has, the gRPC
    exporter is installed for OTEL_EXPORTER_OTLP_PROTOCOL=grpc); for OTLP, whether a
    collector answers (the run starts without one, and traces nothing over OTLP)."""
    from asyncrl.telemetry import tracing

    if not tracing.enabled_by(cfg):
        return Check("tracing.enabled", True, "off")
    problem = tracing.exporter_problem(cfg)
    if problem is not None:
        return Check("tracing.exporter", False, problem)
    kinds = tracing.exporter_kinds(cfg)
    detail = ",".join(kinds)
    if (missing := tracing.missing_collector(cfg)) is not None:  # the run still starts
        others = [kind for kind in kinds if kind != "otlp"]  # what init_tracing keeps
        outcome = f"sends its spans to {', '.join(others)} only" if others else "traces nothing"
        detail += (
            f"; no OTLP collector answers at {missing} now: unless one does when the run "
            f"starts, each process warns and {outcome}"
        )
    return Check("tracing.exporter", True, detail)


def kafka_security_checks(cfg: RunConfig) -> list[Check]:
    from asyncrl.kafka import MissingSecret, security_settings

    sec = cfg.kafka.security
    checks = []
    try:
        security_settings(cfg.kafka)
        checks.append(Check("kafka.security.protocol", True, sec.protocol))
    except MissingSecret as err:
        checks.append(Check("kafka.security.sasl_password_env", False, str(err)))
    for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
        value = getattr(sec, name)
        if value and sec.protocol.endswith("SSL") and not Path(value).is_file():
            checks.append(Check(f"kafka.security.{name}", False, f"{value}: no such file"))
    return checks


def kafka_clients_check(cfg: RunConfig) -> Check:
    """librdkafka's own checks of the client settings (``kafka.extra`` and the kafka.* values
    they are made from), made without a broker."""
    from asyncrl.kafka import MissingSecret
    from asyncrl.kafka.settings import client_settings_problem

    try:
        problem = client_settings_problem(cfg.kafka)
    except MissingSecret:  # its own check says so
        return Check("kafka.extra", None, "not checked: the SASL password is not set")
    if problem is not None:
        key, text = problem
        return Check(key, False, f"librdkafka refuses the client settings: {text}")
    return Check("kafka.extra", True, "librdkafka accepts the client settings")


def master_addr_check(cfg: RunConfig) -> Check:
    """The weight collective's rendezvous host resolves (otherwise every process retries it
    silently: c10d logs only)."""
    key, addr = "sync.master_addr", cfg.sync.master_addr
    try:
        socket.getaddrinfo(addr, None)
    except (OSError, UnicodeError) as err:
        return Check(key, False, f"{addr!r} does not resolve ({err})")
    return Check(key, True, f"{addr} resolves")
