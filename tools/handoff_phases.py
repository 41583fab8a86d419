"""Where an in-place weight handoff's time goes, phase by phase, at both ends (a diagnostic
for issue 14's bar: the handoff within twice a device-to-device copy).

Runs a trainer end here and a worker end in a child process over the real pair, as
``asyncrl bench sync`` does, wraps the phases of ``sync.sender`` and ``sync.receiver`` with wall-clock stamps
(one host, one clock) and prints each phase's median offset from the trainer's call, over
``--rounds`` transfers after three warm-ups. Used by tools/gpu_check.sh.

    python tools/handoff_phases.py --shape 500M --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

WARM = 3
WAIT = timedelta(seconds=120)
STAMPS: list[tuple[str, float]] = []


def _wrap(owner: Any, name: str, tag: str) -> None:
    """Stamp entry and exit of ``owner.name`` as ``tag>`` and ``tag<``."""
    inner = getattr(owner, name)

    def stamped(*args: Any, **kwargs: Any) -> Any:
        STAMPS.append((f"{tag}>", time.time()))
        try:
            return inner(*args, **kwargs)
        finally:
            STAMPS.append((f"{tag}<", time.time()))

    setattr(owner, name, stamped)


def _state(a: argparse.Namespace, fill: bool) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one core each end, as bench sync
    from asyncrl.bench.sync import on_device, qwen2_like_state

    return on_device(
        qwen2_like_state(a.shape, fill=fill), a.device, flat=False if a.apart else None
    )


def trainer(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from asyncrl.launch.broker import free_port
    from asyncrl.sync import manifest, negotiation, pair
    from asyncrl.sync.sender import WeightSender

    _wrap(manifest.PreparedCache, "prepare", "prepare")
    _wrap(negotiation.TrainerMemory, "expose", "expose")
    _wrap(pair.Pair, "signal", "signal")
    _wrap(pair.Pair, "open", "opening sent")
    _wrap(pair, "check_ack", "acknowledgement checked")
    state = _state(a, fill=True)
    store_port, weights_port = free_port(), free_port()
    store = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
    sender = WeightSender("127.0.0.1", weights_port, device=a.device, timeout_s=120)
    sender.start()
    child = subprocess.Popen(
        [sys.executable, __file__, "--worker", str(store_port), str(weights_port), *sys.argv[1:]]
    )
    rows: list[dict[str, float]] = []
    try:
        store.wait(["announce"], WAIT)
        if not sender.connect(0, "phases"):
            raise RuntimeError("the worker end did not join")
        medium = ""
        for r in range(WARM + a.rounds):
            store.wait([f"ready/{r}"], WAIT)
            STAMPS.clear()
            t0 = time.time()
            medium = sender.broadcast(state, 64 << 20).stats.medium
            STAMPS.append(("broadcast returned", time.time()))
            store.wait([f"done/{r}"], WAIT)
            worker = json.loads(store.get(f"done/{r}"))
            if r >= WARM:
                row = {f"trainer {k}": v - t0 for k, v in _numbered(STAMPS)}
                row |= {f"worker {k}": v - t0 for k, v in _numbered(worker)}
                rows.append(row)
            with torch.no_grad():  # a new version, as an optimizer step makes
                next(iter(state.values())).add_(1)
    finally:
        child.wait(timeout=60)
        sender.close()
    layout = "apart" if a.apart or a.device == "cpu" else "flat"
    print(
        f"{a.shape} on {a.device} ({layout}), medium {medium}: median ms after the trainer's call"
    )
    for key in sorted(rows[0], key=lambda k: statistics.median(r[k] for r in rows)):
        print(f"  {statistics.median(r[key] for r in rows) * 1e3:8.3f}  {key}")


def worker(store_port: int, weights_port: int, a: argparse.Namespace) -> None:
    import torch.distributed as dist

    from asyncrl.sync import direct, pair
    from asyncrl.sync.receiver import WeightReceiver

    _wrap(pair.Pair, "take", "opening")
    _wrap(direct.DirectView, "copy_into", "copy launched")
    _wrap(direct.DirectView, "synchronize", "copy finished")
    _wrap(pair.Pair, "acknowledge", "acknowledgement sent")
    _wrap(pair.Pair, "signal", "signal")
    state = _state(a, fill=False)
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=WAIT)
    receiver = WeightReceiver("127.0.0.1", weights_port, device=a.device)
    receiver.join(0, "phases", lambda: store.set("announce", "1"))
    for r in range(WARM + a.rounds):
        STAMPS.clear()
        store.set(f"ready/{r}", "1")
        got = receiver.receive_into(state, 64 << 20)
        STAMPS.append(("receive returned", time.time()))
        if r == WARM - 1:
            print(f"worker: {got.medium}, copy way {got.copy_way or '-'}", flush=True)
            view = receiver.memory.weights
            if view is not None and view._plan is not None:
                print(f"worker: {view._plan.tensors} tensors in {len(view._plan.pairs)} copies")
        store.set(f"done/{r}", json.dumps(STAMPS))
    receiver.close()


def _numbered(stamps: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Stamps named by occurrence where a name repeats (signal 1, signal 2, ...)."""
    seen: dict[str, int] = {}
    out = []
    for name, t in stamps:
        seen[name] = seen.get(name, 0) + 1
        out.append((f"{name} #{seen[name]}" if name.startswith("signal") else name, t))
    return out


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="50M", help="a bench sync shape: 5M, 50M, 500M")
    p.add_argument("--device", default="cpu", help="cpu, cuda")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument(
        "--apart",
        action="store_true",
        help="each tensor in memory of its own (default: one buffer per dtype on a GPU, as the "
        "roles keep their weights there)",
    )
    if argv[:1] == ["--worker"]:
        worker(int(argv[1]), int(argv[2]), p.parse_args(argv[3:]))
    else:
        trainer(p.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
