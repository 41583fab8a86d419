"""The staleness bound through a trainer restart, run by run: the demo (mode c, a sync every 4
steps, 8 samples a step, ``staleness_threshold=0.5``: at most 16 stale samples of a window's
32, lag at most 1), a checkpoint every 5 steps, 60 steps, and the trainer SIGKILLed once
``WeightsPublished(6)`` is on control, so it dies having published a version past its
checkpoint (a dead branch). After each run ``asyncrl audit`` counts stale samples per window
and lag on the version lineage (``ops/audit_staleness.py``).

``python -m tests.staleness_kill --runs 5`` prints one line per run and exits 1 if any run
broke the bound or its audit; the suite runs one (tests/integration/test_staleness_faults.py).
Each run gets its own embedded broker's topics (one broker for all the runs).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KILL_VERSION = 6
BOUND = 16
"""The demo's stale samples a window may train: (1 + 0.5) x 4 x 8 - 4 x 8."""


def overrides(steps: int = 60) -> list[str]:
    """The demo's cadence, a checkpoint every 5 steps, no early stop."""
    return [
        "async_training.trigger_parameter_sync_step=4",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=5",
        "trainer.test_freq=0",
        "trainer.target_accuracy=null",
    ]


def kill_at_sync(cfg: Any, pids: dict[str, int], name: str, version: int, out: dict) -> None:
    """SIGKILL process ``name`` once ``WeightsPublished(version)`` is on control."""
    from asyncrl.kafka import Reader
    from asyncrl.schemas import control as ev

    deadline = time.monotonic() + 300
    while not (cfg.run_dir / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    with Reader(cfg.kafka, cfg.kafka.bootstrap_servers, ev.decode_event) as control:
        control.assign(cfg.topic("control"))
        while time.monotonic() < deadline:
            for rec in control.poll(0.05):
                if isinstance(rec.value, ev.WeightsPublished) and rec.value.version == version:
                    out["killed_at"] = time.time()
                    os.kill(pids[name], signal.SIGKILL)
                    return


@dataclass
class KillResult:
    run_id: str
    killed: bool = False
    step: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    windows: list[tuple[int, int, int]] = field(default_factory=list)
    """(the trainer's version, its window's first step, stale samples trained)."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.killed
            and self.step == 60
            and not any(self.violations.values())
            and self.info.get("max_stale_per_window", BOUND + 1) <= BOUND
            and self.info.get("max_lag", 2) <= 1
        )

    def line(self) -> str:
        bad = {k: n for k, n in self.violations.items() if n}
        return (
            f"STALENESS {self.run_id}: {'ok' if self.ok else 'FAILED'}; killed={self.killed} "
            f"step={self.step} trainer_restarts={self.info.get('trainer_restarts')} "
            f"max_stale_per_window={self.info.get('max_stale_per_window')} (bound {BOUND}) "
            f"max_lag={self.info.get('max_lag')} dropped={self.info.get('dropped_samples')} "
            f"violations={bad or 0}; windows (version, first step, stale) {self.windows}; "
            f"{self.seconds:.0f} s"
        )


def kill_run(cfg: Any) -> KillResult:
    """Run ``cfg`` (its broker up, its topics created) as ``asyncrl run``'s job with the trainer
    SIGKILLed at the sync of version 6, then audit it."""
    from asyncrl.ops.audit import audit_run
    from tests.integration.test_faults import _run_with_fault

    t0 = time.monotonic()
    summary, killed, _out = _run_with_fault(cfg, kill_at_sync, "trainer", KILL_VERSION, join_s=300)
    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    return KillResult(
        cfg.run_id,
        killed=bool(killed),
        step=summary.get("step", 0),
        info=report.info,
        violations=dict(report.violations),
        windows=[(w["version"], w["steps"][0], w["stale"]) for w in report.staleness["windows"]],
        seconds=time.monotonic() - t0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.staleness_kill")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output-dir", default="runs/staleness-kill")
    parser.add_argument("--policy-dir", default=None, help="a warm-started policy's cache_dir")
    parser.add_argument(
        "--warmup-steps", type=int, default=None, help="a shorter warm start (the suite's: 100)"
    )
    args = parser.parse_args(argv)

    from asyncrl.config import load_config
    from asyncrl.kafka.topics import create_run_topics
    from asyncrl.launch.broker import EmbeddedBroker
    from tests.helpers import on_session_broker

    out_dir = Path(args.output_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(log_path=out_dir / "tansu.log")
    bootstrap = broker.start()
    failed = 0
    try:
        for i in range(args.runs):
            extra = [f"run_id=k{i + 1}-{uuid.uuid4().hex[:6]}", f"output_dir='{out_dir}'"]
            if args.policy_dir:
                extra.append(f"actor_rollout_ref.model.cache_dir='{args.policy_dir}'")
            if args.warmup_steps is not None:
                extra.append(f"actor_rollout_ref.model.warmup_steps={args.warmup_steps}")
            cfg = load_config(None, overrides=[*on_session_broker(bootstrap), *extra, *overrides()])
            create_run_topics(cfg, bootstrap)
            result = kill_run(cfg)
            print(result.line(), flush=True)
            failed += not result.ok
    finally:
        broker.stop()
    print(f"STALENESS {args.runs - failed} of {args.runs} runs clean", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
