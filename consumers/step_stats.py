"""A trainer step's figures besides the update's own, under verl's names and with verl's meaning,
and the run-long counters behind them (``StepStats``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from confluent_kafka import KafkaException

from asyncrl.config import RunConfig
from asyncrl.kafka.interfaces import Source
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample
from asyncrl.telemetry.metrics import throughput_metrics, timing_metrics

log = logging.getLogger(__name__)

ROLLOUTER_RATIOS = {
    "rollouter/idle_ratio": "idle_ratio",
    "rollouter/budget_idle_ratio": "budget_idle_ratio",
    "rollouter/engine_occupancy": "engine_occupancy",
    "rollouter/budget_unfilled_ratio": "budget_unfilled_ratio",
}
"""Each worker's figures of a sync window (metric -> RolloutResumed field), logged as their
mean over the workers."""

STALE_SAMPLES = "fully_async/count/stale_samples_processed"
STALE_TRAJECTORIES = "fully_async/count/stale_trajectory_processed"
CUMULATIVE = (STALE_SAMPLES, STALE_TRAJECTORIES)
"""verl's cumulative counters the trainer keeps (in its checkpointed history, so a restarted
trainer goes on counting from its checkpoint)."""


def run_devices(cfg: RunConfig) -> int:
    """The run's devices as verl's perf/throughput counts them: one per trainer rank
    (``trainer.nnodes x trainer.n_gpus_per_node``) and one per rollout worker."""
    return cfg.trainer.ranks + cfg.actor_rollout_ref.rollout.num_workers


class StepStats:
    """What the trainer counts over a run: samples trained, samples generated (the topic's end
    offsets), when it started, and the checkpointed ``history`` (cumulative counters, the last
    held-out accuracy, idle ratios)."""

    def __init__(self, history: dict[str, Any], n_devices: int) -> None:
        self.history = history
        self.n_devices = n_devices
        """verl's perf/throughput divides by every GPU of the run, trainer's and rollout's:
        here ``run_devices``."""
        self.t_start = time.monotonic()
        self.samples_trained = 0
        self.generated = 0
        self.last_sync: dict[str, float] = {}
        """The last sync's timing_s/param_sync*, logged once, with the step after it."""

    def validated(self, events: list[ev.Validated], metrics: dict[str, float]) -> float | None:
        """Rollout-side evaluations (use_trainer_do_validate=false) that arrived since the last
        step: step 0's is the initial accuracy, the others go into this step's ``metrics``
        (with the version they measured). Returns the latest accuracy, or None."""
        accuracy = None
        for e in events:
            suffix = "_initial" if e.step == 0 else ""
            target = self.history if e.step == 0 else metrics
            target[f"val/accuracy{suffix}"] = accuracy = e.accuracy
            if e.tool_use >= 0:
                target[f"val/tool_use{suffix}"] = e.tool_use
            if e.step:
                metrics["val/version"] = float(e.version)
                self.history["val/accuracy"] = e.accuracy
        events.clear()
        return accuracy

    def summary(
        self,
        *,
        step: int,
        version: int,
        reason: str,
        accuracy: float | None,
        first_join: float | None,
        dropped: dict[str, int],
        filtered: int | None,
        tool_use: bool,
        **sync: Any,
    ) -> dict[str, Any]:
        """The run's summary (``summary.json``, the last line of ``metrics.jsonl``): where and
        why it ended, its accuracy, counts, and the coordinator's ``sync`` figures."""
        out: dict[str, Any] = {
            "step": step,
            "version": version,
            "reason": reason,
            "val/accuracy": accuracy,
            "val/accuracy_initial": self.history.get("val/accuracy_initial"),
            "elapsed_s": time.monotonic() - self.t_start,
            "first_worker_joined_s": None if first_join is None else first_join - self.t_start,
            "samples_trained": self.samples_trained,
            "dropped": dropped,
            **({} if filtered is None else {"filtered": filtered}),
            **sync,
        }
        if tool_use:  # the agent loop: how often the policy calls tools
            out["val/tool_use"] = self.history.get("val/tool_use")
            out["val/tool_use_initial"] = self.history.get("val/tool_use_initial")
        return out

    def of_step(
        self,
        samples: list[Sample],
        *,
        step: int,
        version: int,
        timing_raw: dict[str, float],
        first_join: float | None,
        dropped: int,
        duplicates: int,
        queued: int,
    ) -> dict[str, float]:
        """The figures of a step just done (besides the update's own): ``step_metrics``, the
        run's throughput and counts, the idle ratios of the last sync window, and the last
        sync's times (once)."""
        self.samples_trained += len(samples)
        now = time.monotonic()
        out = step_metrics(
            samples,
            step=step,
            version=version,
            totals=self.history,
            timing_raw=timing_raw,
            n_devices=self.n_devices,
            generated=self.generated,
        )
        out.update(
            {
                # From when rollout could start (the first worker got its weights), not
                # from the trainer's start: its start-up wait is no one's throughput.
                "perf/samples_per_s": self.samples_trained
                / max(now - (first_join or self.t_start), 1e-9),
                "perf/elapsed_s": now - self.t_start,
                # The count itself: the rate is over a shorter time than elapsed_s, so
                # rate x elapsed overcounted (the report's per-step samples/s).
                "perf/samples_trained": float(self.samples_trained),
                "fully_async/count/dropped_samples": float(dropped),
                "fully_async/count/duplicate_samples": float(duplicates),
                "trainer/queue_size": float(queued),
            }
        )
        for key in ("trainer/idle_ratio", *ROLLOUTER_RATIOS):
            if key in self.history:
                out[key] = self.history[key]
        out.update(self.last_sync)
        self.last_sync = {}
        return out

    def count_generated(self, samples: Source[Sample], topic: str) -> None:
        """Samples the rollout workers have published so far (verl's
        ``fully_async/count/total_generated_samples``): the topic's end offsets, summed (the
        last fetch's watermark: no broker round trip on the step's path). Kept at the last
        answer if the broker does not give one."""
        try:
            self.generated = max(
                self.generated, sum(samples.end_offsets(topic, ask=False).values())
            )
        except (KafkaException, TimeoutError) as err:  # a metric must not stop training
            log.warning("end offsets of %s: %s", topic, err)

    def close_sync_window(
        self, trainer_idle: float, rollouter: Mapping[str, Mapping[int, float]] | None = None
    ) -> None:
        """At a sync: the ratios of the window that ends (logged from this step on): the
        trainer's idle ratio, and each ``rollouter/...`` figure as the workers' mean."""
        self.history["trainer/idle_ratio"] = trainer_idle
        for key, per_worker in (rollouter or {}).items():
            if per_worker:
                self.history[key] = mean(per_worker.values())


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
        "fully_async/staleness/mean": mean(staleness),
        "fully_async/staleness/max": float(max(staleness, default=0)),
    }
    for k in sorted(set(staleness)):
        out[f"fully_async/staleness/count_{k}"] = float(staleness.count(k))
    return out


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / max(len(values), 1)
