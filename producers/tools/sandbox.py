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

import json
import subprocess
import sys
import time
from dataclasses import dataclass

_CHILD = r"""
import ast, json, resource, sys
req = json.loads(sys.stdin.readline())
mb = 1024 * 1024
resource.setrlimit(resource.RLIMIT_CPU, (req["cpu_s"], req["cpu_s"] + 1))
resource.setrlimit(resource.RLIMIT_AS, (req["memory_mb"] * mb, req["memory_mb"] * mb))
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

def reply(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()

SAFE = {n: getattr(__builtins__, n) for n in req["builtins"]}
try:
    tree = ast.parse(req["code"], mode=req["mode"])
    why = refuse(tree, set(req["allowed"]) if req["allowed"] is not None else None)
    if why:
        reply(ok=False, error=why)
    else:
        code = compile(tree, "<tool>", req["mode"])
        scope = {"__builtins__": SAFE}
        if req["mode"] == "eval":
            reply(ok=True, output=repr(eval(code, scope)))
        else:
            exec(code, scope)
            reply(ok=True, output=repr(scope.get("result")))
except MemoryError:
    reply(ok=False, error="out of memory")
except RecursionError:
    reply(ok=False, error="too deep")
except Exception as e:
    reply(ok=False, error=f"{type(e).__name__}: {e}")
"""

SAFE_BUILTINS = ("abs", "min", "max", "round", "divmod", "int", "float", "len", "sum", "range")
"""Builtins the sandboxed code may call (no ``pow``: three-argument pow is a CPU bomb too)."""


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    output: str = ""
    error: str = ""
    seconds: float = 0.0


def run_python(
    code: str,
    mode: str = "eval",
    allowed_nodes: frozenset[str] | None = None,
    cpu_s: int = 1,
    memory_mb: int = 256,
    timeout_s: float = 5.0,
    max_digits: int = 4300,
    builtins: tuple[str, ...] = SAFE_BUILTINS,
) -> SandboxResult:
    """Evaluate ``code`` (``mode`` "eval": an expression; "exec": statements, ``result`` is
    returned) in a sandboxed child; never raises for anything the code does.

    ``builtins``: the names it may call (tests widen it to show the resource limits hold on
    their own)."""
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
    }
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD],
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
