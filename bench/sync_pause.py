"""``asyncrl bench sync-pause``: the same workload in mode (c), mode (d) and mode (d) with
in-flight weight updates, one after the other.

In mode (c) a sync waits for every in-flight sample to finish; in mode (d) it interrupts them
between two tokens and logs them to ``partials``; with ``in_flight_update`` nobody pauses (the
weights are received beside the live ones and swapped in between two tokens). The figures of
merit are the time the trainer waits from SyncRequested until every worker has paused, and the
time from SyncRequested until the workers have resumed, split hop by hop from the control
events on the run's log (``ops/sync_hops.py``). The workload is the ``sim`` engine's long-tail
response lengths (most responses short, one in ten near ``max_response_length``), the case
partial rollout exists for: in mode (c) nearly every sync waits for some long response.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig, load_config
from asyncrl.ops.sync_hops import HOPS, hop_medians, run_control_events, sync_hops

SYNC_PAUSE_DEFAULTS = [
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=1",  # a sync after every step: many to time
    "actor_rollout_ref.rollout.name=sim",
    "data.max_response_length=256",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=8",
    "trainer.total_training_steps=30",
    "trainer.target_accuracy=null",
    "trainer.test_freq=0",
    "output_dir=runs/bench",
]
MODES = (("c", "false", "false"), ("d", "true", "false"), ("d in flight", "true", "true"))
"""(mode, partial_rollout, in_flight_update)."""


def step_rows(cfg: RunConfig) -> list[dict[str, Any]]:
    """The per-step rows of a run's metrics file (the summary row left out)."""
    with open(cfg.run_dir / "metrics.jsonl") as f:
        return [row for row in map(json.loads, f) if "step" in row]


def trainer_restarts(summary: dict[str, Any]) -> int:
    """How often the launcher restarted the run's trainer (``launch.run``'s summary). A
    restarted trainer's summary and its metrics' clock (``perf/elapsed_s``) start again at its
    checkpoint: times read from them are not the run's."""
    return int(summary.get("restarts", {}).get("trainer", 0))


def one_trainer(cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary``, if the run's trainer was never restarted; else a clear error (a benchmark
    that read such a run's times would print figures for a part of it)."""
    if n := trainer_restarts(summary):
        raise RuntimeError(
            f"{cfg.run_id}: the trainer died and was restarted from its checkpoint ({n}x; "
            f"{cfg.run_dir / 'logs' / 'trainer.log'} says why): its clock restarted with it, "
            "so this run's timings are not a measurement; run the benchmark again"
        )
    return summary


def partial_totals(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(partial trajectories trained on, max span) over a run's step rows.

    ``fully_async/partial/total_partial_num`` counts the trajectories of one step's batch that
    span more than one weight version (verl's per-batch figure), so the run's total is the sum.
    """
    num = sum(int(row.get("fully_async/partial/total_partial_num", 0)) for row in rows)
    span = max((int(row.get("fully_async/partial/max_partial_span", 0)) for row in rows), default=0)
    return num, span


def sync_pause(config: str | None, overrides: list[str], console: Console) -> dict[str, Any]:
    """Run mode (c) then mode (d) on the same workload; print and return the figures."""
    from asyncrl.launch.launcher import run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, dict[str, Any]] = {}
    hops: dict[str, dict[str, float]] = {}
    for mode, partial, in_flight in MODES:
        cfg = load_config(
            config,
            [
                *SYNC_PAUSE_DEFAULTS,
                *overrides,
                f"async_training.partial_rollout={partial}",
                f"async_training.in_flight_update={in_flight}",
                f"run_id=sync-pause-{mode.replace(' ', '-')}-{stamp}",
            ],
        )
        console.rule(f"mode ({mode})")
        summary = one_trainer(cfg, run(cfg, console))
        n_partial, span = partial_totals(step_rows(cfg))
        results[mode] = {
            **summary,
            "partial_trajectories": n_partial,
            "max_partial_span": span,
            "samples_per_s": summary["samples_trained"] / summary["elapsed_s"],
        }
        hops[mode] = hop_medians(sync_hops(run_control_events(cfg)))
    table = Table(title="sync pause: modes (c), (d) and (d) in flight, same workload")
    cols = (
        "mode",
        "syncs",
        "pause mean s",
        "pause max s",
        "requested->resumed mean s",
        "samples/s",
    )
    for col in (*cols, "partial trajectories"):
        table.add_column(col, justify="right")
    for mode, r in results.items():
        table.add_row(
            mode,
            str(r["syncs"]),
            f"{r['sync_pause_s_mean']:.3f}",
            f"{r['sync_pause_s_max']:.3f}",
            _seconds(r["sync_resumed_s_mean"]),
            f"{r['samples_per_s']:.1f}",
            str(r["partial_trajectories"]),
        )
    console.print(table)
    console.print(hop_table(hops))
    c, d = results["c"], results["d"]
    ratio = c["sync_pause_s_mean"] / max(d["sync_pause_s_mean"], 1e-9)
    console.print(
        f"mean sync pause: mode (c) {c['sync_pause_s_mean'] * 1e3:.0f} ms, "
        f"mode (d) {d['sync_pause_s_mean'] * 1e3:.0f} ms: (c)/(d) = {ratio:.2f}x; "
        f"whole sync (SyncRequested -> last RolloutResumed): "
        f"(c) {_ms(c['sync_resumed_s_mean'])}, (d) {_ms(d['sync_resumed_s_mean'])}; "
        f"throughput (d)/(c) = {d['samples_per_s'] / c['samples_per_s']:.2f}x"
    )
    return {**results, "pause_ratio_c_over_d": ratio, "hops": hops}


def hop_table(hops: dict[str, dict[str, float]]) -> Table:
    """Median milliseconds of each hop of a sync (rows) in each mode (columns)."""
    table = Table(title="where a sync's time goes: median ms per hop (from the control events)")
    table.add_column("hop")
    for mode in hops:
        table.add_column(mode, justify="right")
    for label, key in HOPS:
        if any(key in h for h in hops.values()):
            table.add_row(
                label, *(f"{h[key] * 1e3:.1f}" if key in h else "" for h in hops.values())
            )
    return table


def _seconds(value: float | None) -> str:
    """A summary's time, or "-" where the trainer read none (sync_resumed_s_*)."""
    return "-" if value is None else f"{value:.3f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f} ms"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench sync-pause``: its description (it takes no flags of its own)."""
    p.description = (
        "The sim engine's long-tail workload in mode (c), mode (d, partial rollout) and mode "
        "(d) with in-flight weight updates; prints how long syncs waited for the workers to "
        "pause, the throughput of each, and where a sync's time goes, hop by hop (from the "
        "control events on the log)."
    )


def main(args: argparse.Namespace, console: Console) -> None:
    sync_pause(args.config, args.overrides, console)
