"""Bytes the trainer's bookkeeping keeps per step, broker-free: its SampleBatcher and
SyncCoordinator driven as Trainer.run drives them (offer, take, samples received per version,
a sync every 4 steps with a worker's pause, load and resume read back), at the demo's shapes
(8 samples a step, ids ``<prompt>@<epoch>`` over 2,000 prompts), under tracemalloc. The
broker's own records and the metrics rows (a file, in a run) are left out. docs/design.md
("What the trainer keeps") quotes it.

    .venv/bin/python tools/trainer_memory.py 3000
"""

from __future__ import annotations

import gc
import json
import sys
import time
import tracemalloc

import torch

from asyncrl.config import load_config
from asyncrl.consumers.batcher import SampleBatcher
from asyncrl.consumers.coordinator import SyncCoordinator
from asyncrl.kafka import Record
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample, Trajectory
from asyncrl.sync.results import BroadcastResult, TransferStats
from asyncrl.telemetry.metrics import WaitClock
from asyncrl.testing import MemoryBroker

DATASET, PER_STEP, TRIGGER, WARM_UP = 2000, 8, 4, 200


class OneWorker:
    """The sending end, with worker 0 a member; no tensors move."""

    members = {0: "inc"}

    def broadcast(
        self, model: object, bucket_bytes: int, workers: object = None, dtype: object = None
    ) -> BroadcastResult:
        return BroadcastResult(TransferStats(0, 0.0, 0, 0), dict(self.members))

    def close(self) -> None:
        pass


def main(steps: int) -> None:
    cfg = load_config(overrides=["run_id=mem", "output_dir=/tmp/trainer_memory"])
    broker = MemoryBroker()
    control = broker.control(cfg)
    control.start()
    worker = broker.control(cfg, worker=0, incarnation="inc")
    batcher = SampleBatcher(max_version_lag=cfg.async_training.max_version_lag)
    step, offset = [0], [0]
    coordinator = SyncCoordinator(
        cfg,
        control,
        torch.nn.Linear(1, 1),
        lambda dtype: "",
        lambda: (step[0], batcher.consumed),
        lambda row: None,  # a run writes its rows to metrics.jsonl
        WaitClock(),
    )
    coordinator.sender = OneWorker()  # type: ignore[assignment]

    def pause(record: Record[bytes | None]) -> None:
        if record.topic == cfg.topic("control") and record.value is not None:
            event = ev.decode_event(record.value, record.headers)
            if isinstance(event, ev.SyncRequested):
                worker.publish(ev.RolloutPaused(run_id=cfg.run_id, version=event.version, worker=0))

    broker.reactions.append(pause)
    trajectory = Trajectory([5, 6, 2], [-0.5, -0.4, -0.3], 1.0)

    def one_step() -> None:
        for _ in range(PER_STEP):
            k = offset[0]
            sample_id = f"add-{k % DATASET}-x@{k // DATASET}"
            sample = Sample(sample_id, sample_id.split("@")[0], 0, [1, 7], "3", [trajectory])
            rec = Record(cfg.topic("samples"), 0, k, sample_id, 0, {}, sample)
            offset[0] += 1
            if batcher.offer(rec, coordinator.version) is None:
                coordinator.received[(0, coordinator.version)] += 1
        batcher.take(PER_STEP)
        step[0] += 1
        if step[0] % TRIGGER == 0:
            coordinator.sync()
            v = coordinator.version
            worker.publish(ev.WeightsLoaded(run_id=cfg.run_id, version=v, worker=0, load_s=0.01))
            worker.publish(ev.RolloutResumed(run_id=cfg.run_id, version=v, worker=0))
            coordinator.handle_control()
            log = broker.topics[cfg.topic("control")]  # the broker is not the trainer
            log[: len(log) - 4] = [None] * (len(log) - 4)  # type: ignore[list-item]

    for _ in range(WARM_UP):
        one_step()
    gc.collect()
    tracemalloc.start(3)
    before = tracemalloc.take_snapshot()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    gc.collect()
    after = tracemalloc.take_snapshot()
    took = time.perf_counter() - t0
    left_out = [
        tracemalloc.Filter(False, "*/asyncrl/testing.py"),
        tracemalloc.Filter(False, "*/testing.py"),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    diff = after.filter_traces(left_out).compare_to(before.filter_traces(left_out), "filename")
    kept = sum(d.size_diff for d in diff)
    print(f"{steps} steps in {took:.1f} s: {kept / steps:.0f} bytes kept per step")
    for d in diff[:5]:
        print(f"  {d.traceback[0].filename}: {d.size_diff / steps:+.0f} B/step")
    per_version = ("received", "requested_ts", "resumed_s", "load_s", "trainer_side")
    print("per-version entries:", {k: len(getattr(coordinator, k)) for k in per_version})
    print(f"batcher state in a checkpoint: {len(json.dumps(batcher.state())) / 1e3:.1f} KB")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
