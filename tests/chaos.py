"""Random faults at random moments during a mode (d) run with 2 workers, seeded and printed:
SIGKILL of the trainer or a worker, the embedded broker SIGSTOPped for 2-6 s, and SIGKILL of
``asyncrl run`` itself followed by the same command again. After the run: it finished (at
most one more start of the same command once the faults are over), and ``asyncrl audit`` is
clean, its staleness checks included. Each fault waits for its target (and the trainer) to
run: one thrown while a restart has not brought them back would hit nothing.

``python -m tests.chaos --seeds 5 --faults 16 --steps 400`` (``make chaos``) prints one line
per seed; the suite runs one short seed (tests/integration/test_chaos.py). A run is replayed
by its seed. Overrides after the options change the run: ``actor_rollout_ref.rollout.name=vllm``
(vLLM workers, killed mid-partial), ``trainer.n_gpus_per_node=2 trainer.device=cpu`` (a
trainer fault kills any one of the ranks). ``python -m tests.chaos --launch CONFIG PIDS`` is the launcher process the faults
kill: ``asyncrl run``'s job, writing each process it starts to the file PIDS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = ("trainer", "worker", "broker", "run")


def chaos_overrides(steps: int) -> list[str]:
    """Mode (d) with 2 workers, small groups, a sync every step, a checkpoint every 3 steps,
    and restarts enough for every fault."""
    return [
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.max_concurrent_samples=4",
        "actor_rollout_ref.rollout.num_workers=2",
        "actor_rollout_ref.rollout.max_restarts=100",
        "async_training.staleness_threshold=0.5",
        "async_training.partial_rollout=true",
        "async_training.trigger_parameter_sync_step=1",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=3",
        "trainer.test_freq=0",
        "trainer.target_accuracy=null",
        "trainer.max_restarts=100",
    ]


@dataclass
class ChaosResult:
    seed: int
    faults: list[str] = field(default_factory=list)
    landed: int = 0
    """Faults that hit a running process."""
    finished: bool = False
    starts: int = 0
    audit: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.finished and bool(self.audit.get("ok"))

    def line(self) -> str:
        bad = {k: n for k, n in self.audit.get("violations", {}).items() if n}
        info = self.audit.get("info", {})
        windows = self.audit.get("staleness", {}).get("windows", [])
        return (
            f"CHAOS seed {self.seed}: {'ok' if self.ok else 'FAILED'}; finished={self.finished} "
            f"starts={self.starts} faults={len(self.faults)} landed={self.landed} "
            f"({', '.join(self.faults)}); "
            f"trainer_restarts={info.get('trainer_restarts')} "
            f"windows={len(windows)} max_stale_per_window={info.get('max_stale_per_window')} "
            f"(bound {min((w['bound'] for w in windows), default=None)}) "
            f"max_lag={info.get('max_lag')} dropped={info.get('dropped_samples')} "
            f"violations={bad or 0}; {self.seconds:.0f} s"
        )


def _pids(path: Path) -> dict[str, int]:
    """The newest pid of each process the launcher started."""
    out: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, pid = line.partition(" ")
            if pid.isdigit():
                out[name] = int(pid)
    return out


def _signal(pid: int | None, sig: int) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _alive(pid: int | None) -> bool:
    return pid is not None and _signal(pid, 0)


def _wait_for_target(
    pids: Path, names: tuple[str, ...], launcher: subprocess.Popen, timeout_s: float = 300
) -> dict[str, int] | None:
    """The launcher's newest pids once every process in ``names`` runs (a fault thrown at a
    process that a restart has not brought back yet would hit nothing); None if the launcher
    ended first or they never came up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        now = _pids(pids)
        if all(_alive(now.get(name)) for name in names):
            return now
        time.sleep(0.2)
    return None


def _wait_for_first_step(cfg: Any, launcher: subprocess.Popen, timeout_s: float = 600) -> None:
    metrics = cfg.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        if metrics.exists() and '"step": 1,' in metrics.read_text():
            return
        time.sleep(0.2)


def chaos_run(
    cfg: Any, seed: int, faults: int, gap_s: tuple[float, float] = (3.0, 12.0)
) -> ChaosResult:
    """Run ``cfg`` (embedded broker) as ``asyncrl run``'s job in a process of its own, with
    ``faults`` random faults (``FAULTS``) at random gaps of ``gap_s``; then audit it."""
    from asyncrl.config import dump_config

    rng = random.Random(seed)
    ranks = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    result = ChaosResult(seed)
    t0 = time.monotonic()
    config = cfg.run_dir.parent / f"{cfg.run_id}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, config)
    pids = cfg.run_dir.parent / f"{cfg.run_id}.pids"
    command = [sys.executable, "-m", "tests.chaos", "--launch", str(config), str(pids)]
    log = open(cfg.run_dir.parent / f"{cfg.run_id}.launcher.log", "ab")  # noqa: SIM115
    launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    result.starts = 1
    try:
        _wait_for_first_step(cfg, launcher)  # faults while the run trains, not at its set-up
        for i in range(faults):
            time.sleep(rng.uniform(*gap_s))
            kind = rng.choice(FAULTS)
            if kind == "worker":
                kind = f"rollout-{rng.randrange(2)}"
            elif kind == "trainer" and ranks > 1:  # any one rank of a sharded trainer
                rank = rng.randrange(ranks)
                kind = f"trainer-rank-{rank}" if rank else "trainer"
            # Every fault lands while the run trains: its target, and the trainer, running.
            waited = time.monotonic()
            targets = (kind,) if kind.startswith(("rollout", "trainer-rank")) else ()
            now = _wait_for_target(pids, ("trainer", "broker", *targets), launcher)
            if now is None:
                break  # finished (or failed) before every fault was thrown
            waited = time.monotonic() - waited
            if kind == "trainer" or kind.startswith(("rollout-", "trainer-rank-")):
                hit = _signal(now.get(kind), signal.SIGKILL)
            elif kind == "broker":
                stall = rng.uniform(2.0, 6.0)
                kind = f"broker {stall:.1f}s"
                hit = _signal(now.get("broker"), signal.SIGSTOP)
                if hit:
                    time.sleep(stall)
                    _signal(now.get("broker"), signal.SIGCONT)
            else:
                launcher.kill()
                launcher.wait(60)
                time.sleep(1)
                launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                result.starts += 1
                hit = True
            if waited >= 1:
                kind += f" (after {waited:.0f} s for it to run)"
            result.landed += hit
            missed = "" if hit else " (not running)"
            result.faults.append(f"{i}:{kind}@{time.monotonic() - t0:.0f}s{missed}")
            print(f"CHAOS seed {seed} fault {result.faults[-1]}", file=sys.__stderr__)
        rc = launcher.wait(1800)
        if rc != 0:  # at most one more start of the same command
            launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            result.starts += 1
            rc = launcher.wait(1800)
        result.finished = rc == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(60)
        log.close()
    result.audit = audit_archive(cfg)
    result.seconds = time.monotonic() - t0
    return result


def audit_archive(cfg: Any) -> dict[str, Any]:
    """``asyncrl audit --json``'s verdict on the run's archived log."""
    from asyncrl.launch.log_archive import offline_broker
    from asyncrl.ops.audit import audit_run

    with offline_broker(cfg) as bootstrap:
        return audit_run(cfg, bootstrap).to_dict()


def _launch(config: str, pids: str) -> int:
    from rich.console import Console

    from asyncrl.config import load_config
    from asyncrl.launch.launcher import run

    cfg = load_config(config)

    def spawned(name: str, pid: int) -> None:
        with open(pids, "a") as f:
            f.write(f"{name} {pid}\n")

    summary = run(cfg, Console(file=sys.stdout, width=200), on_spawn=spawned)
    return 0 if summary.get("step") == cfg.trainer.total_training_steps else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--launch", nargs=2, metavar=("CONFIG", "PIDS"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=16)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--gap-s",
        type=float,
        nargs=2,
        default=(2.0, 8.0),
        metavar=("MIN", "MAX"),
        help="seconds between two faults, drawn from [MIN, MAX]",
    )
    parser.add_argument("--output-dir", default="runs/chaos")
    parser.add_argument("--policy-dir", default=None, help="a warm-started policy's cache_dir")
    parser.add_argument(
        "--warmup-steps", type=int, default=None, help="a shorter warm start (the suite's: 100)"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="more config overrides, e.g. actor_rollout_ref.rollout.name=vllm (a vLLM worker "
        "killed mid-partial) or trainer.n_gpus_per_node=2 trainer.device=cpu (any one of two "
        "trainer ranks killed)",
    )
    args = parser.parse_args(argv)
    if args.launch:
        return _launch(*args.launch)

    from asyncrl.config import load_config

    failed = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        overrides = [
            f"run_id=chaos{seed}-{int(time.time())}",
            f"output_dir='{Path(args.output_dir).resolve()}'",
            *chaos_overrides(args.steps),
        ]
        if args.policy_dir:
            overrides.append(f"actor_rollout_ref.model.cache_dir='{args.policy_dir}'")
        if args.warmup_steps is not None:
            overrides.append(f"actor_rollout_ref.model.warmup_steps={args.warmup_steps}")
        overrides += args.overrides
        cfg = load_config(None, overrides=overrides)
        cfg.kafka.bootstrap_servers = None
        result = chaos_run(cfg, seed, args.faults, gap_s=tuple(args.gap_s))
        print(result.line(), flush=True)
        if not result.ok:
            failed += 1
            print(json.dumps(result.audit.get("examples", {})), flush=True)
    print(f"CHAOS {args.seeds - failed} of {args.seeds} seeds clean", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
