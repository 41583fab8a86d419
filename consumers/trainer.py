"""The trainer process: samples in, policy updates, weight versions out.

Per local update (a "step"), in this order:
1. Wait until ``require_batches x ppo_mini_batch_size`` samples are queued (staleness filter
   and dynamic sampling applied on arrival; drops are counted, published as SamplesDropped,
   never silent).
2. Take them first-in first-out; GRPO advantages per group; one optimizer step per mini-batch.
3. Publish the step's record to ``steps`` (which samples, which version, metrics) and flush.
4. Every ``save_freq`` steps: copy the checkpoint (model, optimizer, step, version, settled
   offsets) into host memory and write it on a thread while training goes on (one write at a
   time); once it is on disk, commit those offsets to the trainer's group (for lag monitoring
   only; the checkpoint is the source of truth). The run's last checkpoint is written before
   RunFinished.
5. Every ``trigger_parameter_sync_step`` steps: SyncRequested(v+1) -> wait for every worker's
   RolloutPaused (not with ``in_flight_update``) -> broadcast the weights in buckets ->
   WeightsPublished(v+1, checksum). The trainer then goes on without waiting for the workers
   to load and resume.

Workers come and go between steps and during a sync's wait: the coordinator
(``consumers/coordinator.py``) keeps the membership of the weight collective and runs the sync
hand-shake. What the trainer reads and writes comes in through ``TrainerIO`` (Kafka by
default, in memory in tests: ``asyncrl.testing``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from opentelemetry import trace

from asyncrl.config import RunConfig
from asyncrl.consumers import spans
from asyncrl.consumers.backend import UpdateBackend, make_backend
from asyncrl.consumers.batcher import Dropped, SampleBatcher, starved
from asyncrl.consumers.checkpoint import TrainerCheckpoints, TrainerState
from asyncrl.consumers.coordinator import SyncCoordinator
from asyncrl.consumers.dynamic_sampling import REASON as FILTERED
from asyncrl.consumers.dynamic_sampling import check_gen_batches, filter_metrics
from asyncrl.consumers.evaluation import TrainerEvaluation
from asyncrl.consumers.io import TrainerIO, kafka_io
from asyncrl.consumers.step_stats import StepStats, run_devices
from asyncrl.consumers.update import warn_if_no_reward
from asyncrl.kafka import Record
from asyncrl.producers.feed import FeedAhead, feeds_ahead
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample
from asyncrl.schemas.step import TAG as STEP_TAG
from asyncrl.schemas.step import StepRecord, encode_step
from asyncrl.sync.checksum import weights_checksum
from asyncrl.telemetry import tracing
from asyncrl.telemetry.metrics import JsonlWriter, TensorBoardWriter, WaitClock

log = logging.getLogger(__name__)

WAIT_NOTE_S = 10.0
"""A step that waits this long for its samples says so in the log, once."""


class TrainerStopped(Exception):
    """The trainer was told to stop (SIGTERM, Ctrl-C) and stopped between two steps, its
    checkpoint of the last one written: a restart resumes there and trains no step again."""


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        bootstrap: str | None = None,
        on_step: Callable[[dict], None] | None = None,
        io: TrainerIO | None = None,
        backend: UpdateBackend | None = None,
    ):
        self.cfg = cfg
        tracing.init_tracing(cfg, "asyncrl-trainer")
        self.on_step = on_step or (lambda m: None)
        self.backend = backend or make_backend(cfg)
        """Holds the policy and its optimizer and takes the updates (``consumers/backend.py``)."""
        self.model = self.backend.model
        self.step, version = 0, 0
        self.batcher = SampleBatcher(
            max_version_lag=cfg.async_training.max_version_lag,
            filter_groups=cfg.filters_groups,
            vocab_size=self.model.get_input_embeddings().num_embeddings,  # type: ignore[operator]
        )
        history: dict[str, Any] = {}
        self.checkpoints = TrainerCheckpoints(cfg.run_dir, cfg.trainer.keep_checkpoints)
        ckpt = self.checkpoints.latest
        offsets = None
        if ckpt is not None:
            state = self.backend.load(ckpt)
            self.step, version, history = state.step, state.version, state.metrics
            offsets = self.batcher.restore(state.batcher)
            log.info("resumed from %s: step %d, version %d", ckpt, self.step, version)
        self.feed: FeedAhead | None = None
        """The rest of the prompt feed, written as the run goes (``producers/feed.py``)."""
        if io is None:
            bootstrap = bootstrap or cfg.kafka.bootstrap_servers
            if bootstrap is None:
                raise ValueError("no Kafka broker: pass bootstrap or set kafka.bootstrap_servers")
            io = kafka_io(cfg, bootstrap)
            if feeds_ahead(cfg):
                self.feed = FeedAhead(cfg, bootstrap, io.publisher)
        self.io = io
        self.io.samples.assign(cfg.topic("samples"), offsets)
        self.io.control.start()
        self.stats = StepStats(history, n_devices=run_devices(cfg))
        learns = self.backend.learns
        self.evaluation = TrainerEvaluation(cfg, self.backend.tokenizer, self.history, not learns)
        self.metrics_file = JsonlWriter(cfg.run_dir / "metrics.jsonl")
        tb = cfg.run_dir / "tensorboard"
        self.tensorboard = TensorBoardWriter(tb) if "tensorboard" in cfg.trainer.logger else None
        self.wait_clock = WaitClock()
        self.stopping: str | None = None
        """Why the trainer was told to stop (``stop``): it does at the next step boundary."""
        self._checksums: dict[torch.dtype | None, str] = {}
        """Checksums of the current weights, as they are (None) and cast to a workers' dtype."""
        self.coordinator = SyncCoordinator(
            cfg,
            self.io.control,
            model=self.model,
            checksum=self._checksum,
            position=lambda: (self.step, self.batcher.consumed),
            write_row=self.metrics_file.write,
            wait_clock=self.wait_clock,
            version=version,
        )
        self.resumed = self.coordinator.take_version_above(
            self.io.last_logged_version(),
            step=self.step,
            resumed=ckpt is not None,
            history=self.io.control_history(),
        )

    def stop(self, why: str) -> None:
        """Stop at the next step boundary, or now if waiting for samples, with a checkpoint
        of the last step (safe to call from a signal handler), so a restart trains no step
        again."""
        self.stopping = why

    @property
    def version(self) -> int:
        return self.coordinator.version

    @property
    def history(self) -> dict[str, Any]:
        return self.stats.history

    def _checksum(self, dtype: torch.dtype | None = None) -> str:
        """Checksum of the current weights (cast to ``dtype``: as the workers receive them),
        computed once per weight state: the sync after a step, the joins before the next and
        the record of the next step need the same one."""
        if dtype not in self._checksums:
            self._checksums[dtype] = weights_checksum(self.model, dtype=dtype)
        return self._checksums[dtype]

    def _start_checksum(self) -> str:
        """The checksum a step's record carries of the weights it starts from, for ``asyncrl
        replay step`` to check what it loaded: where a replay can start (the initial weights,
        or a step that was checkpointed: every ``save_freq``), or where a sync after the last
        step already computed it; "" elsewhere (a replay needs the checkpoint of the step before:
        there is none to check). Hashing a real model costs ~1 s per GB on one core
        (sync/checksum.py), so steps in between do not."""
        save_freq = self.cfg.trainer.save_freq
        if self.step == 0 or (save_freq and self.step % save_freq == 0):
            return self._checksum()
        return self._checksums.get(None, "")

    # --- samples --------------------------------------------------------------------------------
    def _read_samples(self, timeout: float) -> None:
        for rec in self.io.samples.poll(timeout):
            dropped = self.batcher.offer(rec, self.version)
            duplicate = dropped is not None and dropped.kind == "duplicate"
            if not duplicate:
                self.coordinator.received[(rec.value.worker_id, rec.value.param_version)] += 1
            if dropped is not None:
                self._report_dropped(dropped)

    def _report_dropped(self, dropped: Dropped) -> None:
        """Log a dropped sample and publish its SamplesDropped."""
        level = logging.INFO if dropped.kind == FILTERED else logging.WARNING
        log.log(level, "dropped sample %s: %s", dropped.record.value.sample_id, dropped.reason)
        self.io.control.publish(dropped.event(self.cfg.run_id, self.version))

    def _wait_for_batch(self, n: int) -> list[Record[Sample]]:
        deadline = time.monotonic() + self.cfg.sync.timeout_s
        while True:
            for dropped in self.batcher.expire(self.version):  # aged past the lag in the queue
                self._report_dropped(dropped)
            self._wait_for_samples(n, deadline)
            if self.coordinator.deferred:
                # A worker joined after an update: a new version now, not the current one's
                # number on newer weights (coordinator module doc). It may be the only worker.
                self.stats.last_sync = self.coordinator.sync()
                continue
            refused = self.coordinator.staleness.screen(self.batcher, n, self.version)
            for dropped in refused:  # past the staleness bound (consumers/staleness_guard.py)
                self._report_dropped(dropped)
            if not refused:
                batch = self.batcher.take(n)
                self.coordinator.staleness.trained(batch, self.version)
                return batch

    def _wait_for_samples(self, n: int, deadline: float) -> None:
        """Until ``n`` samples are in, or a joined worker waits for a new version. A wait past
        ``WAIT_NOTE_S`` is said once in the log (a role started by hand: is a worker up?)."""
        noted: float | None = time.monotonic() + WAIT_NOTE_S
        with self.wait_clock.waiting():
            while len(self.batcher) < n and not self.coordinator.deferred:
                if self.stopping:
                    self._stop()
                if noted is not None and time.monotonic() > noted:
                    noted = None
                    members = sorted(self.coordinator.members)
                    log.info(
                        "step %d waits for samples: %d of %d in; %s",
                        *(self.step + 1, len(self.batcher), n),
                        f"workers joined: {members}"
                        if members
                        else "no rollout worker has joined yet (asyncrl rollout --worker-id N)",
                    )
                self.coordinator.handle_control()
                self._read_samples(0.1)
                if self.batcher.filter_groups is not None:
                    filtered = self.batcher.filtered_ahead(n)
                    fg = self.cfg.algorithm.filter_groups
                    check_gen_batches(fg, len(self.batcher), filtered, n, self.step + 1)
                if time.monotonic() > deadline:
                    topic = self.cfg.topic("samples")
                    raise starved(self.batcher, n, topic, self.cfg.sync.timeout_s)

    # --- one update -----------------------------------------------------------------------------
    def train_step(self, batch: list[Record[Sample]]) -> dict[str, float]:
        return self.backend.step([r.value for r in batch], self.step + 1, self.version)

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
        topic = self.cfg.topic("steps")
        self.io.publisher.publish(
            topic, str(self.step), encode_step(rec), headers={SCHEMA_HEADER: STEP_TAG}
        )
        self.io.publisher.flush()
        self.metrics_file.write({"step": self.step, "version": self.version, **metrics})
        if self.tensorboard is not None:
            self.tensorboard.write(self.step, {"version": float(self.version), **metrics})

    def checkpoint(self, wait: bool = False) -> None:
        """Step 4: a snapshot of the state now, written on the writer's thread (``wait``: and
        on disk before this returns)."""
        self.checkpoints.writer.wait()  # before the snapshot: the write before holds host copies
        state = TrainerState(
            step=self.step, version=self.version, batcher=self.batcher.state(), metrics=self.history
        )
        topic = self.cfg.topic("samples")
        offsets = {(topic, p): o for p, o in self.batcher.settled_offsets().items()}
        self.checkpoints.save(self.backend.snapshot(state), self.io.samples.commit, offsets)
        if wait:
            self.checkpoints.wait()

    # --- the loop (steps 1-5 of the module docstring) --------------------------------------------
    def run(self) -> dict[str, Any]:
        tc, at = self.cfg.trainer, self.cfg.async_training
        self.coordinator.sender = self.io.weights(self.backend.device)
        if self.resumed is not None:
            self.io.control.publish(self.resumed)
        evaluation = self.evaluation
        accuracy = evaluation.initial(self.model)
        reason = "total_training_steps reached"
        metrics: dict[str, float] = {}
        while self.step < tc.total_training_steps:
            if self.stopping:
                self._stop()
            if self.feed is not None:
                self.feed.through(self.step)
            t_step = time.monotonic()
            batch = self._wait_for_batch(self.cfg.required_samples)  # 1
            filtered = self.batcher.taken_filtered
            gen_s = time.monotonic() - t_step
            step_span = spans.start_step(
                batch, self.step + 1, self.version, self.cfg.topic("samples")
            )
            checksum_before = self._start_checksum()  # lets a replay check its start
            t_update = time.monotonic()
            metrics = self.train_step(batch)  # 2
            warn_if_no_reward([r.value for r in batch], metrics, self.step + 1)
            t_end = time.monotonic()
            self._checksums.clear()  # the update changed the weights
            self.step += 1
            self.stats.count_generated(self.io.samples, self.cfg.topic("samples"))
            timing = {"gen": gen_s, "update_actor": t_end - t_update, "step": t_end - t_step}
            measured = evaluation.after_step(self.step, self.model, metrics)
            rollout_side = self.stats.validated(self.coordinator.validations, metrics)
            if self.step == 1:  # where the run started, in its first row: a killed run has
                # no summary, and `asyncrl report` reads it there
                for key in ("val/accuracy_initial", "val/tool_use_initial"):
                    if key in self.history:
                        metrics[key] = self.history[key]
            accuracy = next((a for a in (rollout_side, measured) if a is not None), accuracy)
            synced = self.step % at.trigger_parameter_sync_step == 0
            if synced:
                idle, _window = self.wait_clock.close_window()
                self.stats.close_sync_window(idle, self.coordinator.rollouter)
            metrics.update(
                self.stats.of_step(
                    [r.value for r in batch],
                    step=self.step,
                    version=self.version,
                    timing_raw=timing,
                    first_join=self.coordinator.first_join,
                    dropped=sum(self.batcher.dropped.values()),
                    duplicates=self.batcher.dropped["duplicate"],
                    queued=len(self.batcher),
                )
            )
            if self.batcher.filter_groups is not None:
                metrics.update(filter_metrics(filtered, len(batch), self.batcher.filtered))
            spans.end_step(step_span, metrics)
            with trace.use_span(step_span, end_on_exit=True):
                self._record_step(batch, metrics, checksum_before)  # 3
            self.on_step({"step": self.step, "version": self.version, **metrics})
            log.info(
                "step %d, version %d: reward %.3f%s, %.1f samples/s",
                *(self.step, self.version, metrics.get("critic/score/mean", float("nan"))),
                f", held-out accuracy {metrics['val/accuracy']:.3f}"
                if "val/accuracy" in metrics
                else "",
                metrics.get("perf/samples_per_s", 0.0),
            )
            target = tc.target_accuracy
            if target is not None and "val/accuracy" in metrics and (accuracy or 0.0) >= target:
                reason = f"target accuracy {target:.2f} reached"
                break
            if tc.save_freq and self.step % tc.save_freq == 0:
                self.checkpoint()  # 4
            self.checkpoints.commit_written()
            if synced and self.step < tc.total_training_steps:
                self.stats.last_sync = self.coordinator.sync(trigger=step_span)  # 5
        if self.backend.learns and (accuracy is None or "val/accuracy" not in metrics):
            accuracy = evaluation.measure(self.model)
        self.checkpoint(wait=True)
        # Only a run that ended publishes RunFinished: a trainer that dies (an exception, a
        # kill) leaves the run open, and a restarted trainer resumes it from its checkpoint
        # while the workers wait for it (they stop on RunFinished).
        self.io.control.publish(
            ev.RunFinished(
                run_id=self.cfg.run_id, version=self.version, step=self.step, reason=reason
            )
        )
        self.io.publisher.flush()
        summary = self.stats.summary(
            step=self.step,
            version=self.version,
            reason=reason,
            accuracy=accuracy,
            first_join=self.coordinator.first_join,
            dropped=dict(self.batcher.dropped),
            filtered=self.batcher.filtered if self.batcher.filter_groups else None,
            tool_use=evaluation.tool_use is not None,
            **self.coordinator.summary(),
        )
        self.metrics_file.write({"summary": summary})
        return summary

    def _stop(self) -> None:
        """Between two steps: the last one's checkpoint on disk, then TrainerStopped. No
        RunFinished: the run stays open, and the workers wait for the trainer's restart."""
        self.checkpoint(wait=True)
        raise TrainerStopped(
            f"stopped ({self.stopping}) after step {self.step}, version {self.version}: its "
            "checkpoint is written; asyncrl train with the same config resumes from it"
        )

    def close(self) -> None:
        try:
            self.checkpoints.writer.wait()
        except RuntimeError as err:  # the run failed already, or its end raised this
            log.error("%s", err)
        self.metrics_file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.io.close()
        self.coordinator.close()
        self.checkpoints.close()
