"""Bytes each process of a run keeps per step: runs ``asyncrl run`` with the given overrides,
samples the resident memory of the launcher and every process under it (from /proc, by pid)
every few seconds with the steps done so far (``metrics.jsonl``), and fits bytes per step
per process after a warm-up. docs/design.md ("Each process of a run, per step, measured")
quotes it.

    .venv/bin/python tools/role_memory.py trainer.total_training_steps=3000 \
        trainer.target_accuracy=null trainer.test_freq=0 trainer.save_freq=500
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WARM_UP = 300
"""Steps left out of the fit: start-up, the first checkpoint, caches filling."""


def _descendants(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [pid] + [d for c in children for d in _descendants(int(c))]


def _rss(pid: int) -> tuple[int, str] | None:
    """(resident bytes, command line) of ``pid``, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0)
    return kb * 1024, cmd


def _kind(cmd: str) -> str:
    """What a process under the launcher is, from its command line (roles: see ``_roles``)."""
    for word, kind in (("tansu", "broker"), ("forkserver", "fork server"), ("resource", "tracker")):
        if word in cmd:
            return kind
    return cmd[:40]


def _steps(metrics: Path) -> int:
    """Steps done: the rows of ``metrics.jsonl`` that are a step's (not a sync's)."""
    try:
        with metrics.open("rb") as f:
            return sum(1 for line in f if b'"training/global_step"' in line)
    except OSError:
        return 0


def _roles(run_dir: Path) -> dict[int, str]:
    """pid -> role, from the launcher's line naming them (a restarted role's too)."""
    out: dict[int, str] = {}
    log = run_dir / "role_memory.out"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        for part in line.replace(";", ",").split(","):
            words = part.split()
            if len(words) >= 3 and words[-2] == "pid" and words[-1].isdigit():
                out[int(words[-1])] = words[-3]
    return out


def main(overrides: list[str], every_s: float = 3.0) -> None:
    run_id = f"memory{os.getpid()}"
    out_dir = Path("/tmp/role_memory")
    run_dir = out_dir / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "asyncrl", "run", f"run_id={run_id}", f"output_dir={out_dir}"]
    with (run_dir / "role_memory.out").open("w") as log:
        proc = subprocess.Popen([*cmd, *overrides], stdout=log, stderr=subprocess.STDOUT)
    samples: dict[int, list[tuple[int, int]]] = {}
    names: dict[int, str] = {}
    while proc.poll() is None:
        steps = _steps(run_dir / "metrics.jsonl")
        for pid in _descendants(proc.pid):
            got = _rss(pid)
            if got is not None:
                samples.setdefault(pid, []).append((steps, got[0]))
                names.setdefault(pid, "launcher" if pid == proc.pid else _kind(got[1]))
        time.sleep(every_s)
    names.update(_roles(run_dir))
    print(f"asyncrl run exited {proc.returncode}; run in {run_dir}")
    for pid, points in samples.items():
        kept = [(s, b) for s, b in points if s >= WARM_UP]
        if len({s for s, _ in kept}) < 3:
            continue
        s, b = np.array(kept, dtype=float).T
        slope = np.polyfit(s, b, 1)[0]
        print(
            f"{names[pid]:>12} (pid {pid}): steps {s[0]:.0f}-{s[-1]:.0f}, "
            f"{b[0] / 2**20:.0f} -> {b[-1] / 2**20:.0f} MiB (max {b.max() / 2**20:.0f}), "
            f"{slope:+.0f} bytes/step"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
