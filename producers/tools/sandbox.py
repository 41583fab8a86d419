"""Run untrusted Python in a throwaway subprocess: CPU-time, memory and file limits, no imports.

Why a subprocess and not ``eval`` in the worker: the model writes the arguments. A policy that
emits ``9**9**9**9`` or a loop must cost the rollout one tool error, not the worker's CPU,
memory or files. Four layers, each enough for a different escape:

1. The code is parsed first and refused if it imports, touches a dunder attribute
   (``().__class__.__subclasses__()``), or, with ``allowed_nodes`` set, uses any other syntax.
2. It runs with a short list of builtins: no ``__import__``, ``open``, ``eval``, ``exec``.
3. Before running it, the child sets ``RLIMIT_CPU`` (the kernel kills a busy loop),
   ``RLIMIT_AS`` (a huge allocation raises MemoryError), ``RLIMIT_NOFILE`` = 3 (no new file
   or socket can be opened: stdin/stdout/stderr are the only descriptors) and
   ``RLIMIT_FSIZE`` = 0 (nothing can be written to a file).
4. The parent waits at most ``timeout_s`` wall time, then kills the child (a sleep, a stall).

The child is ``python -I -S`` (isolated: no site-packages, no environment, no cwd on the path)
and talks JSON over stdin/stdout, so nothing it returns is unpickled.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

_EVAL = r"""
import ast, builtins, json, os, resource, sys
MB = 1024 * 1024

def limit(req):
    resource.setrlimit(resource.RLIMIT_CPU, (req["cpu_s"], req["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (req["memory_mb"] * MB, req["memory_mb"] * MB))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, 3))
    sys.set_int_max_str_digits(req["max_digits"])

def refuse(tree, allowed):
    for node in ast.walk(tree):
        name = type(node).__name__
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return "imports are not allowed"
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return "private attributes are not allowed"
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return "dunder names are not allowed"
        if allowed is not None and name not in allowed:
            return f"{name} is not allowed here"
    return None

def evaluate(req):
    safe = {n: getattr(builtins, n) for n in req["builtins"]}
    try:
        tree = ast.parse(req["code"], mode=req["mode"])
        why = refuse(tree, set(req["allowed"]) if req["allowed"] is not None else None)
        if why:
            return {"ok": False, "error": why}
        code = compile(tree, "<tool>", req["mode"])
        scope = {"__builtins__": safe}
        if req["mode"] == "eval":
            return {"ok": True, "output": repr(eval(code, scope))}
        exec(code, scope)
        return {"ok": True, "output": repr(scope.get("result"))}
    except MemoryError:
        return {"ok": False, "error": "out of memory"}
    except RecursionError:
        return {"ok": False, "error": "too deep"}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}

def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]

def reply(fd, out):
    write_all(fd, (json.dumps(out) + "\n").encode())
"""

_SPAWN = (
    _EVAL
    + r"""
req = json.loads(sys.stdin.readline())
limit(req)
reply(1, evaluate(req))
"""
)
"""One interpreter per call: read one request, set the limits, evaluate, reply, exit."""

_SERVER = (
    _EVAL
    + r"""
import selectors, signal, time
REPLY_LIMIT = 1 << 20

def child(req, w):
    # fds 0 and 1 become the reply pipe, 2 the server's stderr (/dev/null): with
    # RLIMIT_NOFILE = 3 no other descriptor can exist, so nothing can be opened.
    try:
        os.dup2(w, 1)
        os.dup2(w, 0)
        os.closerange(3, 1 << 16)
        limit(req)
        reply(1, evaluate(req))
    finally:
        os._exit(0)

sel = selectors.DefaultSelector()
running = {}  # read end of a child's reply pipe -> [request id, pid, deadline, timeout, bytes]

def start(req):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        child(req, w)
    os.close(w)
    timeout = req["timeout_s"]
    running[r] = [req["id"], pid, time.monotonic() + timeout, timeout, bytearray()]
    sel.register(r, selectors.EVENT_READ)

def finish(r, error=None):
    rid, pid, _, _, data = running.pop(r)
    sel.unregister(r)
    os.close(r)
    if error is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    if error is None:
        try:
            out = json.loads(bytes(data).split(b"\n", 1)[0])
        except ValueError:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            why = "CPU time limit" if sig in (signal.SIGXCPU, signal.SIGKILL) else (
                f"signal {sig}" if sig else f"exit {os.waitstatus_to_exitcode(status)}")
            out = {"ok": False, "error": f"killed ({why})"}
    else:
        out = {"ok": False, "error": error}
    out["id"] = rid
    reply(1, out)

sel.register(0, selectors.EVENT_READ)
pending, reading = b"", True
while reading or running:
    now = time.monotonic()
    for r, (_, _, deadline, timeout, _) in list(running.items()):
        if now >= deadline:
            finish(r, f"timed out after {timeout:g} s")
    wait = min((e[2] for e in running.values()), default=now + 1.0) - now
    for key, _ in sel.select(max(0.0, wait)):
        if key.fd == 0:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the worker closed the pipe (or died): stop every call, exit
                reading = False
                sel.unregister(0)
                for r in list(running):
                    finish(r, "sandbox server stopped")
                continue
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                start(json.loads(line))
        elif key.fd in running:
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                finish(key.fd)
            else:
                running[key.fd][4] += chunk
                if len(running[key.fd][4]) > REPLY_LIMIT:
                    finish(key.fd, "reply too large")
"""
)
"""A small server that forks a child per call: the fork of an idle, already-imported
interpreter costs ~1 ms where starting one costs ~20-30 ms of CPU. Each child is a fresh copy
of a server that never ran untrusted code, so calls share nothing."""


SAFE_BUILTINS = ("abs", "min", "max", "round", "divmod", "int", "float", "len", "sum", "range")
"""Builtins the sandboxed code may call (no ``pow``: three-argument pow is a CPU bomb too)."""


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    output: str = ""
    error: str = ""
    seconds: float = 0.0


class ForkServer:
    """The worker's side of the sandbox server: one server process, started on first use,
    serving concurrent calls from any thread (each request carries an id; a reader thread
    hands each reply to its caller). Restarted if it dies; a process that forked from ours
    (Ray, multiprocessing) starts its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = 0
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._ids = itertools.count()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
        )
        self._proc, self._pid, self._pending = proc, os.getpid(), {}
        pending = self._pending
        threading.Thread(target=self._read, args=(proc, pending), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen[bytes], pending: dict[int, Future[dict]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            reply = json.loads(line)
            future = pending.pop(reply.pop("id"), None)
            if future is not None:
                future.set_result(reply)
        with self._lock:  # the server is gone: whoever still waits gets an error
            for future in pending.values():
                future.set_result({"ok": False, "error": "sandbox server exited"})
            pending.clear()

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request (the server enforces ``timeout_s``); wait for its reply."""
        future: Future[dict[str, Any]] = Future()
        line = b""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None or self._pid != os.getpid():
                proc = self._start()
            rid = next(self._ids)
            self._pending[rid] = future
            line = (json.dumps({**request, "id": rid}) + "\n").encode()
            try:
                assert proc.stdin is not None
                proc.stdin.write(line)
                proc.stdin.flush()
            except OSError:
                self._pending.pop(rid, None)
                return {"ok": False, "error": "sandbox server exited"}
        try:  # a backstop: the server kills the call at timeout_s and replies
            return future.result(timeout=request["timeout_s"] + 5.0)
        except FutureTimeout:
            self._pending.pop(rid, None)
            return {"ok": False, "error": f"timed out after {request['timeout_s']:g} s"}

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and self._pid == os.getpid():
            assert proc.stdin is not None
            proc.stdin.close()  # the server stops its calls and exits
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


_server = ForkServer()
atexit.register(_server.close)


def run_python(
    code: str,
    mode: str = "eval",
    allowed_nodes: frozenset[str] | None = None,
    cpu_s: int = 1,
    memory_mb: int = 256,
    timeout_s: float = 5.0,
    max_digits: int = 4300,
    builtins: tuple[str, ...] = SAFE_BUILTINS,
    fresh_interpreter: bool = False,
) -> SandboxResult:
    """Evaluate ``code`` (``mode`` "eval": an expression; "exec": statements, ``result`` is
    returned) in a sandboxed child; never raises for anything the code does.

    The child is forked by the sandbox server (:data:`_SERVER`), or with
    ``fresh_interpreter`` a new interpreter started for this call alone (~20x the CPU; the
    same limits). ``builtins``: the names it may call (tests widen it to show the resource
    limits hold on their own)."""
    if mode not in ("eval", "exec"):
        raise ValueError(f"mode must be 'eval' or 'exec', not {mode!r}")
    request = {
        "code": code,
        "mode": mode,
        "allowed": sorted(allowed_nodes) if allowed_nodes is not None else None,
        "builtins": list(builtins),
        "cpu_s": cpu_s,
        "memory_mb": memory_mb,
        "max_digits": max_digits,
        "timeout_s": timeout_s,
    }
    t0 = time.monotonic()
    if fresh_interpreter:
        return _spawn(request, t0)
    reply = _server.call(request)
    seconds = time.monotonic() - t0
    if str(reply.get("error", "")).startswith("timed out"):
        seconds = timeout_s
    return SandboxResult(
        bool(reply.get("ok")), str(reply.get("output", "")), str(reply.get("error", "")), seconds
    )


def _spawn(request: dict[str, Any], t0: float) -> SandboxResult:
    timeout_s = request["timeout_s"]
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _SPAWN],
            input=json.dumps(request) + "\n",
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={},
        )
    except subprocess.TimeoutExpired:
        return SandboxResult(False, error=f"timed out after {timeout_s:g} s", seconds=timeout_s)
    seconds = time.monotonic() - t0
    line = done.stdout.strip().splitlines()[-1:] if done.stdout else []
    if done.returncode != 0 or not line:
        # Killed by RLIMIT_CPU (SIGXCPU/SIGKILL) or crashed before it could reply.
        why = "CPU time limit" if done.returncode in (-24, -9) else f"exit {done.returncode}"
        return SandboxResult(False, error=f"killed ({why})", seconds=seconds)
    try:
        reply = json.loads(line[0])
    except json.JSONDecodeError:
        return SandboxResult(False, error="unreadable reply", seconds=seconds)
    return SandboxResult(
        bool(reply.get("ok")),
        str(reply.get("output", "")),
        str(reply.get("error", "")),
        seconds,
    )
