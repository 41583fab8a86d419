"""A pair's fast channel: a Unix socket between the trainer and a worker on its host that
reads the weights in place, carrying each transfer's opening number and the worker's
acknowledgement (a gloo message over loopback took 0.1-0.5 ms to arrive on a 2-core machine,
a Unix socket's round trip 60 us).

Framing: every number is a little-endian int64. A worker connects to the trainer's listener
(a name in Linux's abstract namespace, sent in the manifest exchange) and introduces itself
with its pair's key (length, then the UTF-8 bytes); after that, numbers only.
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct

__all__ = [
    "FastListener",
    "WeightChannelError",
    "check_ack",
    "connect_fast",
    "recv_number",
    "send_number",
]

log = logging.getLogger(__name__)

NUMBER = struct.Struct("<q")
"""A number on a pair's fast channel: an opening, an acknowledgement, the length of the
worker's introduction (its pair's key)."""
MAX_INTRODUCTION = 4096
"""The longest introduction accepted, in bytes."""


class WeightChannelError(RuntimeError):
    """A pair's fast channel failed (its peer died or closed it): a RuntimeError, as gloo's
    failures are, so a worker takes it for the trainer's death and joins the next one."""


def send_number(sock: socket.socket, value: int, peer: str) -> None:
    try:
        sock.sendall(NUMBER.pack(value))
    except OSError as err:
        raise WeightChannelError(f"the fast channel to {peer} failed: {err}") from err


def recv_number(sock: socket.socket, peer: str) -> int:
    return int(NUMBER.unpack(recv_bytes(sock, NUMBER.size, peer))[0])


def recv_bytes(sock: socket.socket, n: int, peer: str) -> bytes:
    if not 0 <= n <= MAX_INTRODUCTION:
        raise WeightChannelError(f"{peer} sent a length of {n} on the fast channel")
    data = b""
    try:
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise WeightChannelError(f"{peer} closed the fast channel")
            data += chunk
    except OSError as err:
        raise WeightChannelError(f"the fast channel to {peer} failed: {err}") from err
    return data


def check_ack(got: int, epoch: int) -> None:
    """Raise unless the worker acknowledged ``epoch``."""
    if got != epoch:
        raise RuntimeError(f"the worker acknowledged epoch {got}, not {epoch}")


def connect_fast(name: str, key: str, timeout_s: float) -> socket.socket | None:
    """The worker's end: connected to the trainer's listener ``name`` and introduced as the
    pair ``key``; None (gloo carries the numbers) where that fails."""
    if not name:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect("\0" + name)
        hello = key.encode()
        sock.sendall(NUMBER.pack(len(hello)) + hello)
    except OSError as err:
        sock.close()
        log.warning("no fast channel to the trainer (%s); gloo carries it", err)
        return None
    return sock


class FastListener:
    """The trainer's end: one listening socket that every local worker reading in place
    connects its fast channel to."""

    def __init__(self, timeout_s: float) -> None:
        self.name = f"asyncrl-weights-{secrets.token_hex(8)}"
        """Its name in the abstract namespace (sent to the workers)."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind("\0" + self.name)
            self._sock.listen(64)
            self._sock.settimeout(timeout_s)
        except OSError:
            self._sock.close()
            raise

    def accept(self, key: str, worker: int, timeout_s: float) -> socket.socket:
        """The connection that introduces itself as the pair ``key``. Connections that
        introduce themselves as another pair are closed: a worker killed between connecting
        and replying leaves one behind, never accepted. Raises where the expected one does
        not come."""
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError as err:
                raise WeightChannelError(f"worker {worker}'s fast channel: {err}") from err
            conn.settimeout(timeout_s)
            try:
                who = recv_bytes(conn, recv_number(conn, "a worker"), "a worker").decode()
            except Exception as err:
                conn.close()
                log.info("a stale fast channel closed (%s)", err)
                continue
            if who == key:
                return conn
            conn.close()
            log.info("the fast channel of %s closed: it is not %s's", who, key)

    def close(self) -> None:
        self._sock.close()
