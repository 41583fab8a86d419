"""The compose cluster's asyncrl services, run natively: the exact commands and environment.

No Docker engine here, so docker/compose.yaml is read as data and each asyncrl service's
``command`` and ``environment`` are run as local processes (the image's entrypoint is the
``asyncrl`` CLI). Only what names the containers' world is mapped: ``kafka:9092`` to the test
broker, ``trainer`` to 127.0.0.1 and its port to a free one, the ``/runs`` and ``/cache``
volumes to temporary directories, and Jaeger's OTLP endpoint to a local HTTP sink that decodes
what it receives. Compose variables (``${RUN_ID:-demo}``) are filled as compose would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from asyncrl.launch.broker import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

COMPOSE = Path(__file__).parents[2] / "docker" / "compose.yaml"
ASYNCRL_SERVICES = ["setup", "trainer", "rollout-0", "rollout-1", "monitor"]


def _interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ${VAR:-default} and ${VAR}."""
    return re.sub(
        r"\$\{(\w+)(?::-([^}]*))?\}",
        lambda m: variables.get(m.group(1), m.group(2) or ""),
        text,
    )


class OtlpSink(BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP trace exports and records the service name of every resource."""

    services: set[str] = set()
    spans = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            for attr in rs.resource.attributes:
                if attr.key == "service.name":
                    OtlpSink.services.add(attr.value.string_value)
            OtlpSink.spans += sum(len(ss.spans) for ss in rs.scope_spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


# Opt-in (`make test-heavy`, ~25 s): CI's `make compose-test` runs these services from the same
# compose files under a real engine, with the trainer killed and the audit at its end.
@pytest.mark.heavy
@pytest.mark.usefixtures("demo_policy")  # the services' warm start, built in the background
def test_compose_services_run_natively(broker, tmp_path, policy_dir):
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert {"kafka", "jaeger", "kafka-ui", *ASYNCRL_SERVICES} <= set(services)
    kafka_env = services["kafka"]["environment"]
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert kafka_env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert int(kafka_env["KAFKA_MESSAGE_MAX_BYTES"]) == 8 * 1024 * 1024  # kafka.max_message_bytes

    sink = ThreadingHTTPServer(("127.0.0.1", 0), OtlpSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    run_id = f"t{uuid.uuid4().hex[:8]}"
    # 4 steps of 8 samples: more than one worker's share of version 0 (1.5 x 4 x 8 / 2 = 24,
    # with the shipped sync every 4 steps), so both workers must take part.
    variables = {"RUN_ID": run_id, "TOTAL_TRAINING_STEPS": "4"}
    world = {
        "kafka:9092": broker,
        "http://jaeger:4318": f"http://127.0.0.1:{sink.server_address[1]}",
        "sync.master_addr=trainer": "sync.master_addr=127.0.0.1",
        "sync.master_port=29500": f"sync.master_port={free_port()}",
        "/runs": str(tmp_path / "runs"),
        "/cache": str(policy_dir),
    }

    def native(name: str) -> tuple[list[str], dict[str, str]]:
        svc = services[name]
        assert svc["image"].startswith("${ASYNCRL_IMAGE")  # runs the asyncrl image
        args = []
        for arg in svc["command"]:
            arg = _interpolate(str(arg), variables)
            for container, here in world.items():
                arg = arg.replace(container, here)
            args.append(arg)
        env = dict(os.environ)
        for key, value in (svc.get("environment") or {}).items():
            value = _interpolate(str(value), variables)
            env[key] = world.get(value, value)
        return [sys.executable, "-m", "asyncrl", *args], env

    def start(name: str) -> subprocess.Popen:
        cmd, env = native(name)
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    try:
        assert start("setup").wait(timeout=300) == 0, (tmp_path / "setup.log").read_text()[-3000:]
        procs = {name: start(name) for name in ASYNCRL_SERVICES[1:]}
        for name, proc in procs.items():
            rc = proc.wait(timeout=300)
            assert rc == 0, f"{name}: " + (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in locals().get("procs", {}).values():
            if proc.poll() is None:
                proc.kill()
        sink.shutdown()

    run_dir = tmp_path / "runs" / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 4 and summary["reason"] == "total_training_steps reached"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["actor_rollout_ref"]["rollout"]["num_workers"] == 2
    produced = {
        w: int(m.group(1))
        for w in (0, 1)
        if (m := re.search(r"produced (\d+) samples", (tmp_path / f"rollout-{w}.log").read_text()))
    }
    assert set(produced) == {0, 1} and all(n > 0 for n in produced.values())  # both took part
    assert "total_training_steps reached" in (tmp_path / "monitor.log").read_text()
    # Every process exported its spans to the "Jaeger" endpoint over OTLP/HTTP.
    assert {"asyncrl-launcher", "asyncrl-trainer", "asyncrl-rollout-0", "asyncrl-rollout-1"} <= (
        OtlpSink.services
    )
    assert OtlpSink.spans > 0
