"""The trainer process: samples in, policy updates, weight versions out.

Per local update (a "step"), in this order:
1. Wait until ``require_batches x ppo_mini_batch_size`` samples are queued (staleness filter
   applied on arrival; drops are counted, published as SamplesDropped, never silent).
2. Take them first-in first-out; GRPO advantages per group; one optimizer step per mini-batch.
3. Publish the step's record to ``steps`` (which samples, which version, metrics) and flush.
4. Every ``save_freq`` steps: write the checkpoint (model, optimizer, step, version, settled
   offsets), then commit those offsets to the trainer's group (for lag monitoring only; the
   checkpoint is the source of truth).
5. Every ``trigger_parameter_sync_step`` steps: SyncRequested(v+1) -> wait for every worker's
   RolloutPaused -> broadcast the weights in buckets -> WeightsPublished(v+1, checksum).
   The trainer then goes on without waiting for the workers to load and resume.

Workers come and go: the trainer serves whoever announces itself (WorkerStarted) over the
weight collective, sending a joining worker the current weights at once. A worker that
restarts has a new incarnation id; if that happens while a sync waits for its pause, the new
incarnation counts as paused (it has nothing in flight) and gets the sync's weights. A worker
whose pair fails, that stops, or that does not pause within ``sync.timeout_s`` is dropped
from the collective; its unfinished prompts go back to the group for the others.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from confluent_kafka import KafkaException
from opentelemetry import trace
from opentelemetry.trace import Span

from asyncrl.config import RunConfig
from asyncrl.consumers import spans
from asyncrl.consumers.batcher import SampleBatcher
from asyncrl.consumers.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from asyncrl.kafka import Publisher, Reader, Record
from asyncrl.producers.budget import worker_share
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample, decode_sample
from asyncrl.schemas.step import TAG as STEP_TAG
from asyncrl.schemas.step import StepRecord, encode_step
from asyncrl.sync.channel import ControlChannel, last_logged_version
from asyncrl.sync.checksum import weights_checksum
from asyncrl.sync.collective import WeightSender
from asyncrl.telemetry import tracing
from asyncrl.telemetry.metrics import (
    JsonlWriter,
    TensorBoardWriter,
    WaitClock,
    throughput_metrics,
    timing_metrics,
)

log = logging.getLogger(__name__)


class Trainer:
    def __init__(
        self, cfg: RunConfig, bootstrap: str, on_step: Callable[[dict], None] | None = None
    ):
        from asyncrl.models.warm_start import load_policy
        from asyncrl.producers.agent.factory import held_out_set

        self.cfg = cfg
        tracing.init_tracing(cfg, "asyncrl-trainer")
        self.on_step = on_step or (lambda m: None)
        self.device = _device(cfg.trainer.device)
        torch.manual_seed(cfg.trainer.seed)
        self.model, self.tokenizer = load_policy(cfg)
        self.model.to(self.device)
        self.model.train()
        optim = cfg.actor_rollout_ref.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay
        )
        self.val_problems = held_out_set(cfg, self.tokenizer)
        self.last_val_tool_use: float | None = None
        self.num_workers = cfg.actor_rollout_ref.rollout.num_workers
        self.simulated = cfg.actor_rollout_ref.rollout.name == "sim"
        """The sim engine's runs model the update's time instead of training (benchmarks)."""
        self.step = 0
        self.version = 0
        self.batcher = SampleBatcher(max_version_lag=cfg.async_training.max_version_lag)
        self.history: dict[str, Any] = {}

        ckpt = latest_checkpoint(cfg.run_dir)
        offsets = None
        if ckpt is not None:
            state = load_checkpoint(ckpt, self.model, self.optimizer)
            self.step, self.version = state.step, state.version
            offsets = self.batcher.restore(state.batcher)
            self.history = state.metrics
            log.info("resumed from %s: step %d, version %d", ckpt, self.step, self.version)

        self.publisher = Publisher(cfg.kafka, bootstrap)
        dead_letter = (self.publisher, cfg.topic("dead-letter"))
        self.samples: Reader[Sample] = Reader(
            cfg.kafka,
            bootstrap,
            decode_sample,
            group_id=f"{cfg.run_id}.trainer",
            dead_letter=dead_letter,
        )
        self.samples.assign(cfg.topic("samples"), offsets)
        self.control = ControlChannel(cfg, bootstrap, self.publisher)
        self.control.start()
        self.resumed: ev.TrainerResumed | None = None
        self._take_version_above_the_log(bootstrap, resumed_step=self.step if ckpt else None)
        self.metrics_file = JsonlWriter(cfg.run_dir / "metrics.jsonl")
        self.tensorboard = (
            TensorBoardWriter(cfg.run_dir / "tensorboard")
            if "tensorboard" in cfg.trainer.logger
            else None
        )
        self.sender: WeightSender | None = None
        self.wait_clock = WaitClock()
        self.rollouter_idle: dict[int, float] = {}
        self.sync_pauses: list[float] = []
        self.sync_requested_ts: dict[int, float] = {}
        """Wall time each version's SyncRequested was published (event ``ts``)."""
        self.sync_resumed_s: dict[int, float] = {}
        """Per version: SyncRequested -> the last member's RolloutResumed, a whole sync."""
        self.sync_load_s: dict[int, float] = {}
        """Per version: the slowest worker's receive + load (WeightsLoaded.load_s)."""
        self.last_sync_of: dict[int, dict[str, float]] = {}
        """Per version: the trainer's side of its sync (pause wait, transfer)."""
        self.unresumed: dict[int, set[int]] = {}
        self.received: Counter[tuple[int, int]] = Counter()
        """Samples read per (worker, param_version): what a leaving worker delivered."""
        self.shared_among: dict[int, list[int]] = {}
        """Per version opened at a sync: the members its budget was split among."""
        """Per version: the members that have not published RolloutResumed for it yet."""
        self._checksum_cache: str | None = None
        self.t_start = time.monotonic()
        self.t_first_join: float | None = None
        """When the first worker got its weights: rollout could start (benchmarks time from it)."""
        self.samples_trained = 0
        self.last_sync: dict[str, float] = {}
        """The last sync's timing_s/param_sync*, logged once, with the step after it."""
        self.n_devices = 1 + self.num_workers
        """verl's perf/throughput divides by every GPU of the run, trainer's and rollout's:
        here the trainer's device and one per rollout worker."""
        self.generated = 0

    def _take_version_above_the_log(self, bootstrap: str, resumed_step: int | None) -> None:
        """A restarted trainer's weights are those of its checkpoint, but an earlier trainer may
        have published later versions before it died (checkpoints are written before a sync,
        and not at every step). Reusing those numbers would give one version two sets of
        weights; the checkpoint's weights get the next free number instead, and the restart is
        logged (TrainerResumed), which also marks the earlier trainer's later steps as void."""
        last = last_logged_version(self.cfg, bootstrap)
        if last < 0 and resumed_step is None:
            return  # a fresh run
        checkpoint_version = self.version
        self.version = max(self.version, last + 1)
        self.resumed = (  # published once the collective is up: workers join on it
            ev.TrainerResumed(
                run_id=self.cfg.run_id,
                version=self.version,
                step=self.step,
                checkpoint_version=checkpoint_version,
                last_logged_version=last,
            )
        )
        log.info(
            "resumed at step %d: the checkpoint's weights (version %d) are published as "
            "version %d (the log holds versions up to %d)",
            self.step,
            checkpoint_version,
            self.version,
            last,
        )

    # --- weights --------------------------------------------------------------------------------
    def _publish_weights(self, pause_wait_s: float = 0.0, workers: list[int] | None = None) -> None:
        """Send the current weights to ``workers`` (default: every member) and announce them
        on ``control``, naming the incarnations that received them."""
        stats_bytes, buckets, transfer_s = 0, 0, 0.0
        delivered: dict[int, str] = {}
        if self.sender is not None:
            sent = self.sender.broadcast(self.model, self._bucket_bytes, workers)
            stats_bytes, buckets, transfer_s = (
                sent.stats.bytes,
                sent.stats.buckets,
                sent.stats.seconds,
            )
            delivered = sent.delivered
        checksum = self._checksum() if self.cfg.sync.verify_checksum else ""
        if workers is None and self.step > 0:  # a sync: the new version is split among these
            self.shared_among[self.version] = sorted(self.members)
        self.control.publish(
            ev.WeightsPublished(
                run_id=self.cfg.run_id,
                version=self.version,
                transfer_s=transfer_s,
                pause_wait_s=pause_wait_s,
                bytes=stats_bytes,
                buckets=buckets,
                checksum=checksum,
                step=self.step,
                incarnations=sorted(delivered.values()),
                consumed={str(w): c for w, c in self.batcher.consumed.items()},
                # A joiner takes its share of the version as it was split ([]: the
                # configured shares, at start-up), not as if it had been there at the sync.
                members=self.shared_among.get(self.version, []),
            )
        )
        if workers is None:
            self.last_sync_of[self.version] = {"pause_s": pause_wait_s, "transfer_s": transfer_s}
            if self.step > 0:
                self.sync_pauses.append(pause_wait_s)

    def _checksum(self) -> str:
        """Checksum of the current weights, computed once per weight state: the sync after a
        step and the record of the next step need the same one."""
        if self._checksum_cache is None:
            self._checksum_cache = weights_checksum(self.model)
        return self._checksum_cache

    @property
    def _bucket_bytes(self) -> int:
        return int(self.cfg.sync.bucket_size_mb * 1024 * 1024)

    def _start_collective(self) -> None:
        sc = self.cfg.sync
        if self.num_workers == 0 and sc.master_port is None:
            return  # trained from samples already on the log: nobody to send weights to
        if sc.master_port is None:
            raise RuntimeError("sync.master_port is not set (the launcher sets it for each run)")
        # Both ends of a pair must pick the same backend. The workers generate on CPU, so
        # "auto" means gloo here even with the trainer on a GPU: its tensors are packed into
        # CPU buckets (NCCL needs the workers on GPUs too: sync.backend=nccl, set explicitly).
        backend = "gloo" if sc.backend == "auto" else sc.backend
        self.sender = WeightSender(
            master_addr=sc.master_addr,
            master_port=sc.master_port,
            backend=backend,
            device=self.device if backend == "nccl" else torch.device("cpu"),
            timeout_s=sc.timeout_s,
        )
        self.sender.start()
        log.info(
            "trainer on %s; weight sync over %s from %s buffers on port %d",
            self.device,
            backend,
            self.sender.device,
            sc.master_port,
        )

    @property
    def members(self) -> dict[int, str]:
        """worker -> incarnation of every worker in the weight collective."""
        return self.sender.members if self.sender is not None else {}

    def _join(self, event: ev.WorkerStarted, syncing: bool = False) -> bool:
        """Accept a worker's announcement; outside a sync, send it the current weights now.

        Returns True if the worker is (now) a member. Repeated announcements of a member are
        ignored; a new incarnation replaces the old one, which is gone.
        """
        if self.sender is None or self.members.get(event.worker) == event.incarnation:
            return self.sender is not None
        old = self.members.get(event.worker)
        if not self.sender.connect(event.worker, event.incarnation):
            return False
        log.info(
            "worker %d joined (incarnation %s%s)",
            event.worker,
            event.incarnation,
            f", replacing {old}" if old else "",
        )
        if not syncing:
            self._publish_weights(workers=[event.worker])
        if self.t_first_join is None:
            self.t_first_join = time.monotonic()
        return True

    def _leave(self, worker: int, why: str) -> None:
        if self.sender is not None and worker in self.members:
            log.warning("worker %d leaves the weight collective: %s", worker, why)
            self.sender.disconnect(worker)
            self._hand_over_share(worker)

    def _hand_over_share(self, worker: int) -> None:
        """A worker left mid-version: grant the others what it had not delivered of its share,
        or the version might never fill (its prompts are redelivered to them).

        Its share is computed as the worker computed it (budget.py); what it delivered is what
        arrived here from it under this version. Its stale samples are not subtracted (the
        trainer does not know them), so the grant can exceed what is missing by those.
        """
        v, total = self.version, self.cfg.max_samples_per_version
        members = self.shared_among.get(v)
        if members is None:  # opened at start-up: the configured shares
            if not 0 <= worker < self.num_workers:
                return
            share = worker_share(total, self.num_workers, worker)
        elif worker in members:
            share = worker_share(total, len(members), members.index(worker))
        else:
            return
        missing = share - self.received[(worker, v)]
        rest = sorted(self.members)
        for i, w in enumerate(rest):
            count = worker_share(max(missing, 0), len(rest), i)
            if count:
                self.control.publish(
                    ev.BudgetGranted(
                        run_id=self.cfg.run_id,
                        version=v,
                        target_worker=w,
                        count=count,
                        reason=f"worker {worker} left with {missing} of its share undelivered",
                    )
                )

    def sync(self, trigger: Span = trace.INVALID_SPAN) -> None:
        """Steps 5 of the class docstring: one weight version, pause to publish."""
        t0 = time.monotonic()
        new_version = self.version + 1
        request = ev.SyncRequested(
            run_id=self.cfg.run_id,
            version=new_version,
            step=self.step,
            consumed={str(w): c for w, c in self.batcher.consumed.items()},
        )
        self.sync_requested_ts[new_version] = request.ts
        with trace.use_span(spans.sync_span(new_version, trigger), end_on_exit=True):
            self.control.publish(request)  # carries this span's context to the workers
            with spans.phase("sync.pause"), self.wait_clock.waiting():
                self._wait_for_pauses(new_version)
            self.version = new_version
            with spans.phase("sync.transfer"):
                self._publish_weights(pause_wait_s=time.monotonic() - t0)
        self.unresumed[new_version] = set(self.members)
        trainer_side = self.last_sync_of[new_version]
        self.last_sync = param_sync_metrics(
            time.monotonic() - t0, trainer_side["pause_s"], trainer_side["transfer_s"]
        )

    def _sync_resumed_by(self, version: int, worker: int) -> None:
        """Once every member resumed ``version``, log the whole sync as one metrics row."""
        waiting = self.unresumed.get(version)
        if waiting is None:
            return
        waiting.discard(worker)
        waiting &= set(self.members)  # a worker that left will not answer
        if waiting:
            return
        del self.unresumed[version]
        self.metrics_file.write(
            {
                "sync": {
                    "version": version,
                    "pause_s": self.last_sync_of.get(version, {}).get("pause_s", 0.0),
                    "transfer_s": self.last_sync_of.get(version, {}).get("transfer_s", 0.0),
                    "load_s": self.sync_load_s.get(version, 0.0),
                    "resumed_s": self.sync_resumed_s[version],
                }
            }
        )

    def _wait_for_pauses(self, version: int) -> None:
        """Until every member has paused for ``version``. A worker that (re)joins meanwhile
        has nothing in flight: it counts as paused and gets this sync's weights."""
        waiting = dict(self.members)
        deadline = time.monotonic() + self.cfg.sync.timeout_s
        while waiting:
            for event in self.control.poll(0.1):
                if isinstance(event, ev.RolloutPaused) and event.version == version:
                    if waiting.get(event.worker) == event.incarnation:
                        del waiting[event.worker]
                elif isinstance(event, ev.WorkerStarted):
                    if self._join(event, syncing=True):
                        waiting.pop(event.worker, None)
                else:
                    self._on_event(event)
            for worker in set(waiting) - set(self.members):  # left during the wait
                del waiting[worker]
            if waiting and time.monotonic() > deadline:
                for worker in waiting:
                    self._leave(worker, f"no RolloutPaused({version}) within sync.timeout_s")
                break

    # --- samples --------------------------------------------------------------------------------
    def _read_samples(self, timeout: float) -> None:
        for rec in self.samples.poll(timeout):
            dropped = self.batcher.offer(rec, self.version)
            duplicate = dropped is not None and dropped.kind == "duplicate"
            if not duplicate:
                self.received[(rec.value.worker_id, rec.value.param_version)] += 1
            if dropped is not None:
                log.warning("dropped sample %s: %s", rec.value.sample_id, dropped.reason)
                self.control.publish(
                    ev.SamplesDropped(
                        run_id=self.cfg.run_id,
                        version=self.version,
                        # A duplicate cost its worker no budget: no worker is refunded.
                        target_worker=ev.TRAINER if duplicate else rec.value.worker_id,
                        count=1,
                        reason=dropped.reason,
                        sample_ids=[rec.value.sample_id],
                    )
                )

    def _handle_control(self) -> None:
        for event in self.control.poll(0.0):
            if isinstance(event, ev.WorkerStarted):
                self._join(event)
            else:
                self._on_event(event)

    def _on_event(self, event: ev.ControlEvent) -> None:
        if isinstance(event, ev.WeightsLoaded) and event.version in self.sync_requested_ts:
            loads = self.sync_load_s
            loads[event.version] = max(event.load_s, loads.get(event.version, 0.0))
        if isinstance(event, ev.RolloutResumed):
            self.rollouter_idle[event.worker] = event.idle_ratio
            requested = self.sync_requested_ts.get(event.version)
            if requested is not None:  # the last worker to resume ends the sync
                took = event.ts - requested
                self.sync_resumed_s[event.version] = max(
                    took, self.sync_resumed_s.get(event.version, 0.0)
                )
                self._sync_resumed_by(event.version, event.worker)
        elif isinstance(event, ev.WeightsLoaded) and not event.checksum_ok:
            raise RuntimeError(
                f"worker {event.worker} loaded weights of version {event.version} that "
                "differ from the trainer's (checksum mismatch)"
            )
        elif (
            isinstance(event, ev.WorkerStopped)
            and self.members.get(event.worker) == event.incarnation
        ):
            self._leave(event.worker, f"stopped ({event.reason})")

    def _wait_for_batch(self, n: int) -> list[Record[Sample]]:
        deadline = time.monotonic() + self.cfg.sync.timeout_s
        with self.wait_clock.waiting():
            while len(self.batcher) < n:
                self._handle_control()
                self._read_samples(0.1)
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"only {len(self.batcher)} of {n} samples arrived on "
                        f"{self.cfg.topic('samples')} within {self.cfg.sync.timeout_s:.0f} s "
                        "(sync.timeout_s): are the rollout workers running?"
                    )
        return self.batcher.take(n)

    def _generated(self) -> int:
        """Samples the rollout workers have published to ``samples`` so far (verl's
        ``fully_async/count/total_generated_samples``): the topic's end offsets, summed. Kept
        at the last answer if the broker does not give one."""
        topic = self.cfg.topic("samples")
        try:
            # The last fetch's watermark: no broker round trip on the step's path.
            self.generated = max(
                self.generated, sum(self.samples.end_offsets(topic, ask=False).values())
            )
        except (KafkaException, TimeoutError) as err:  # a metric must not stop training
            log.warning("end offsets of %s: %s", topic, err)
        return self.generated

    # --- one update -----------------------------------------------------------------------------
    def train_step(self, batch: list[Record[Sample]]) -> dict[str, float]:
        from asyncrl.consumers.update import grpo_update, simulated_update

        cfg = self.cfg
        if self.simulated:
            metrics = simulated_update([r.value for r in batch], cfg)
        else:
            metrics = grpo_update(
                self.model,
                self.optimizer,
                [r.value for r in batch],
                cfg,
                self.device,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return metrics

    def evaluate(self) -> float:
        """Held-out accuracy (the agent loop with its tools when multi_turn is on; its
        tool-use rate goes to ``last_val_tool_use``)."""
        from asyncrl.producers.agent.factory import held_out_accuracy

        self.model.eval()
        measured = held_out_accuracy(self.cfg, self.model, self.tokenizer, self.val_problems)
        self.last_val_tool_use = measured.get("tool_use", self.last_val_tool_use)
        self.model.train()
        return measured["accuracy"]

    def _record_step(
        self, batch: list[Record[Sample]], metrics: dict[str, float], checksum_before: str
    ) -> None:
        rec = StepRecord(
            run_id=self.cfg.run_id,
            step=self.step,
            version=self.version,
            ts=time.time(),
            sample_ids=[r.value.sample_id for r in batch],
            partitions=[r.partition for r in batch],
            offsets=[r.offset for r in batch],
            metrics=metrics,
            weights_checksum=checksum_before,
        )
        self.publisher.publish(
            self.cfg.topic("steps"),
            str(self.step),
            encode_step(rec),
            headers={SCHEMA_HEADER: STEP_TAG},
        )
        self.publisher.flush()
        self.metrics_file.write({"step": self.step, "version": self.version, **metrics})
        if self.tensorboard is not None:
            self.tensorboard.write(self.step, {"version": float(self.version), **metrics})

    def checkpoint(self) -> None:
        state = TrainerState(
            step=self.step, version=self.version, batcher=self.batcher.state(), metrics=self.history
        )
        save_checkpoint(
            self.cfg.run_dir,
            self.model,
            self.optimizer,
            state,
            keep=self.cfg.trainer.keep_checkpoints,
        )
        offsets = self.batcher.settled_offsets()
        topic = self.cfg.topic("samples")
        self.samples.commit({(topic, p): o for p, o in offsets.items()})

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        tc = self.cfg.trainer
        at = self.cfg.async_training
        self._start_collective()
        if self.resumed is not None:
            self.control.publish(self.resumed)
        test_freq = 0 if self.simulated else tc.test_freq  # sim: nothing is learnt
        accuracy = self.history.get("val/accuracy")
        if accuracy is None and test_freq:
            accuracy = self.evaluate()
            self.history["val/accuracy_initial"] = accuracy
            self.history["val/accuracy"] = accuracy
            if self.last_val_tool_use is not None:
                self.history["val/tool_use_initial"] = self.last_val_tool_use
                self.history["val/tool_use"] = self.last_val_tool_use
        reason = "total_training_steps reached"
        metrics: dict[str, float] = {}
        while self.step < tc.total_training_steps:
            t_step = time.monotonic()
            batch = self._wait_for_batch(self.cfg.required_samples)
            gen_s = time.monotonic() - t_step
            step_span = spans.start_step(
                batch, self.step + 1, self.version, self.cfg.topic("samples")
            )
            checksum_before = self._checksum()  # lets a replay check its start
            t_update = time.monotonic()
            metrics = self.train_step(batch)
            t_end = time.monotonic()
            self._checksum_cache = None  # the update changed the weights
            self.step += 1
            self.samples_trained += len(batch)
            elapsed = t_end - self.t_start
            metrics.update(
                step_metrics(
                    [r.value for r in batch],
                    step=self.step,
                    version=self.version,
                    totals=self.history,
                    timing_raw={
                        "gen": gen_s,
                        "update_actor": t_end - t_update,
                        "step": t_end - t_step,
                    },
                    n_devices=self.n_devices,
                    generated=self._generated(),
                )
            )
            metrics.update(
                {
                    # From when rollout could start (the first worker got its weights), not
                    # from the trainer's start: its start-up wait is no one's throughput.
                    "perf/samples_per_s": self.samples_trained
                    / max(time.monotonic() - (self.t_first_join or self.t_start), 1e-9),
                    "perf/elapsed_s": elapsed,
                    "fully_async/count/dropped_samples": float(sum(self.batcher.dropped.values())),
                    "fully_async/count/duplicate_samples": float(self.batcher.dropped["duplicate"]),
                    "trainer/queue_size": float(len(self.batcher)),
                }
            )
            if test_freq and self.step % test_freq == 0:
                accuracy = self.evaluate()
                metrics["val/accuracy"] = accuracy
                self.history["val/accuracy"] = accuracy
                if self.last_val_tool_use is not None:
                    metrics["val/tool_use"] = self.last_val_tool_use
                    self.history["val/tool_use"] = self.last_val_tool_use
            synced = self.step % at.trigger_parameter_sync_step == 0
            if synced:
                idle, _span = self.wait_clock.close_window()
                self.history["trainer/idle_ratio"] = idle
                if self.rollouter_idle:
                    self.history["rollouter/idle_ratio"] = sum(self.rollouter_idle.values()) / len(
                        self.rollouter_idle
                    )
            for key in ("trainer/idle_ratio", "rollouter/idle_ratio"):
                if key in self.history:
                    metrics[key] = self.history[key]
            metrics.update(self.last_sync)  # once: the first step after the sync
            self.last_sync = {}
            spans.end_step(step_span, metrics)
            with trace.use_span(step_span, end_on_exit=True):
                self._record_step(batch, metrics, checksum_before)
            self.on_step({"step": self.step, "version": self.version, **metrics})
            done_early = (
                tc.target_accuracy is not None
                and accuracy is not None
                and (accuracy >= tc.target_accuracy and "val/accuracy" in metrics)
            )
            if done_early:
                reason = f"target accuracy {tc.target_accuracy:.2f} reached"
                break
            if tc.save_freq and self.step % tc.save_freq == 0:
                self.checkpoint()
            if synced and self.step < tc.total_training_steps:
                self.sync(trigger=step_span)
        if not self.simulated and (accuracy is None or "val/accuracy" not in metrics):
            accuracy = self.evaluate()
            self.history["val/accuracy"] = accuracy
            if self.last_val_tool_use is not None:
                self.history["val/tool_use"] = self.last_val_tool_use
        self.checkpoint()
        # Only a run that ended publishes RunFinished: a trainer that dies (an exception, a
        # kill) leaves the run open, and a restarted trainer resumes it from its checkpoint
        # while the workers wait for it (they stop on RunFinished).
        self.control.publish(
            ev.RunFinished(
                run_id=self.cfg.run_id, version=self.version, step=self.step, reason=reason
            )
        )
        self.publisher.flush()
        summary = {
            "step": self.step,
            "version": self.version,
            "reason": reason,
            "val/accuracy": accuracy,
            "val/accuracy_initial": self.history.get("val/accuracy_initial"),
            "elapsed_s": time.monotonic() - self.t_start,
            "first_worker_joined_s": (
                None if self.t_first_join is None else self.t_first_join - self.t_start
            ),
            "samples_trained": self.samples_trained,
            "dropped": dict(self.batcher.dropped),
            "syncs": len(self.sync_pauses),
            "sync_pause_s_mean": sum(self.sync_pauses) / max(len(self.sync_pauses), 1),
            "sync_pause_s_max": max(self.sync_pauses, default=0.0),
            "sync_resumed_s_mean": _mean(self.sync_resumed_s.values()),
            "sync_resumed_s_max": max(self.sync_resumed_s.values(), default=0.0),
        }
        if self.last_val_tool_use is not None:  # the agent loop: how often the policy calls tools
            summary["val/tool_use"] = self.history.get("val/tool_use")
            summary["val/tool_use_initial"] = self.history.get("val/tool_use_initial")
        self.metrics_file.write({"summary": summary})
        return summary

    def close(self) -> None:
        self.metrics_file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.samples.close()
        self.control.close()
        if self.sender is not None:
            self.sender.close()


STALE_SAMPLES = "fully_async/count/stale_samples_processed"
STALE_TRAJECTORIES = "fully_async/count/stale_trajectory_processed"
CUMULATIVE = (STALE_SAMPLES, STALE_TRAJECTORIES)
"""verl's cumulative counters the trainer keeps (in its checkpointed history, so a restarted
trainer goes on counting from its checkpoint)."""


def step_metrics(
    samples: list[Sample],
    *,
    step: int,
    version: int,
    totals: dict[str, Any],
    timing_raw: dict[str, float],
    n_devices: int,
    generated: int,
) -> dict[str, float]:
    """A step's figures besides the update's own (``actor/*`` and the batch's data metrics,
    from ``update.py``), under verl's names and with verl's meaning.

    ``step`` is the step just done (1-based), ``version`` the weight version it trained under,
    ``totals`` the cumulative counters (updated in place), ``timing_raw`` the seconds of
    ``gen`` (waiting for the batch), ``update_actor`` and the whole ``step``, ``n_devices`` the
    GPUs (devices) of the run, ``generated`` the samples published by the rollout so far.
    """
    out = fully_async_metrics(samples, version, totals)
    prompt_tokens = sum(len(s.prompt_ids) * len(s.trajectories) for s in samples)
    response_tokens = sum(len(t.response_ids) for s in samples for t in s.trajectories)
    out.update(timing_metrics(timing_raw, prompt_tokens, response_tokens))
    out.update(throughput_metrics(prompt_tokens + response_tokens, timing_raw["step"], n_devices))
    out["fully_async/total_wait_time"] = timing_raw["gen"]
    out["fully_async/count/total_generated_samples"] = float(generated)
    out["training/global_step"] = float(step)
    return out


def fully_async_metrics(
    samples: list[Sample], version: int, totals: dict[str, Any]
) -> dict[str, float]:
    """verl's ``fully_async/*`` figures of a batch trained at weight ``version``.

    As verl's trainer (``_collect_metrics_from_samples``): a sample (a trajectory) is stale
    when it was finished under an older version than the trainer's, ``version -
    param_version_end >= 1``; the counts are cumulative over the run (``totals``, updated in
    place). As verl's batch assembly (``assemble_batch_from_rollout_samples``), per trajectory
    of the batch: ``partial/total_partial_num`` (trajectories whose tokens span more than one
    version), ``partial/partial_ratio`` (their share), ``partial/max_partial_span`` (most
    versions spanned); ``processing_time/*``, each trajectory's generation time (admission to
    finish, less its tool calls and reward scoring; a trajectory interrupted by a sync counts
    the pause too, where verl's counts generation only); ``timing_s/agent_loop/tool_calls/*``,
    each trajectory's tool time. Also asyncrl's ``fully_async/staleness/*``
    (:func:`staleness_metrics`), by the *oldest* token of each sample.
    """
    trajs = [t for s in samples for t in s.trajectories]
    stale = {
        STALE_SAMPLES: sum(1 for s in samples if version - s.param_version_end >= 1),
        STALE_TRAJECTORIES: sum(1 for t in trajs if version - t.param_version >= 1),
    }
    for key, n in stale.items():
        totals[key] = float(totals.get(key, 0.0)) + n
    version_spans = [t.span for t in trajs]
    partial = sum(1 for span in version_spans if span > 0)
    times = np.array([max(t.t_end - t.t_start - t.tool_s - t.reward_s, 0.0) for t in trajs])
    tools = np.array([t.tool_s for t in trajs])
    out = {key: float(totals[key]) for key in CUMULATIVE}
    out.update(
        {
            "fully_async/count/current_param_version": float(version),
            "fully_async/partial/total_partial_num": float(partial),
            "fully_async/partial/partial_ratio": partial / len(trajs),
            "fully_async/partial/max_partial_span": float(max(version_spans)),
            "fully_async/processing_time/avg": float(times.mean()),
            "fully_async/processing_time/max": float(times.max()),
            "fully_async/processing_time/min": float(times.min()),
            "fully_async/processing_time/tp50": float(np.percentile(times, 50)),
            "fully_async/processing_time/tp99": float(np.percentile(times, 99)),
            "fully_async/processing_time/tp95": float(np.percentile(times, 95)),
            "timing_s/agent_loop/tool_calls/max": float(tools.max()),
            "timing_s/agent_loop/tool_calls/min": float(tools.min()),
            "timing_s/agent_loop/tool_calls/mean": float(tools.mean()),
        }
    )
    out.update(staleness_metrics([version - s.param_version for s in samples]))
    return out


def param_sync_metrics(total_s: float, pause_s: float, transfer_s: float) -> dict[str, float]:
    """A sync's times: verl's ``timing_s/param_sync`` (the trainer's whole sync: pause the
    rollout, then send the weights) and asyncrl's split of it."""
    return {
        "timing_s/param_sync": total_s,
        "timing_s/param_sync_pause": pause_s,
        "timing_s/param_sync_transfer": transfer_s,
    }


def staleness_metrics(staleness: list[int]) -> dict[str, float]:
    """Per step: mean and max versions behind, and a count per staleness value (the report's
    histogram adds them up), for samples consumed at ``version - param_version`` each."""
    out = {
        "fully_async/staleness/mean": _mean(staleness),
        "fully_async/staleness/max": float(max(staleness, default=0)),
    }
    for k in sorted(set(staleness)):
        out[f"fully_async/staleness/count_{k}"] = float(staleness.count(k))
    return out


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / max(len(values), 1)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
