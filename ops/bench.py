"""``asyncrl bench``: measurements printed side by side from one invocation.

``sync-pause``: the same workload in mode (c) and mode (d), one after the other. In mode (c) a
sync waits for every in-flight sample to finish; in mode (d) it interrupts them between two
tokens and logs them to ``partials``. The figure of merit is the time the trainer waits from
SyncRequested until every worker has paused. The workload is the ``sim`` engine's long-tail
response lengths (most responses short, one in ten near ``max_response_length``), the case
partial rollout exists for: in mode (c) nearly every sync waits for some long response.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig, load_config
from asyncrl.ops.plots import line_plot

SYNC_PAUSE_DEFAULTS = [
    "async_training.staleness_threshold=0.5",
    "actor_rollout_ref.rollout.name=sim",
    "data.max_response_length=256",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=8",
    "trainer.total_training_steps=30",
    "trainer.target_accuracy=null",
    "trainer.test_freq=0",
    "output_dir=runs/bench",
]


def step_rows(cfg: RunConfig) -> list[dict[str, Any]]:
    """The per-step rows of a run's metrics file (the summary row left out)."""
    with open(cfg.run_dir / "metrics.jsonl") as f:
        return [row for row in map(json.loads, f) if "step" in row]


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
    from asyncrl.ops.launcher import run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, dict[str, Any]] = {}
    for mode, partial in (("c", "false"), ("d", "true")):
        cfg = load_config(
            config,
            [
                *SYNC_PAUSE_DEFAULTS,
                *overrides,
                f"async_training.partial_rollout={partial}",
                f"run_id=sync-pause-{mode}-{stamp}",
            ],
        )
        console.rule(f"mode ({mode})")
        summary = run(cfg, console)
        n_partial, span = partial_totals(step_rows(cfg))
        results[mode] = {
            **summary,
            "partial_trajectories": n_partial,
            "max_partial_span": span,
            "samples_per_s": summary["samples_trained"] / summary["elapsed_s"],
        }
    table = Table(title="sync pause: mode (c) vs mode (d), same workload")
    cols = ("mode", "syncs", "pause mean s", "pause max s", "pause->resumed s", "samples/s")
    for col in (*cols, "partial trajectories"):
        table.add_column(col, justify="right")
    for mode, r in results.items():
        table.add_row(
            mode,
            str(r["syncs"]),
            f"{r['sync_pause_s_mean']:.3f}",
            f"{r['sync_pause_s_max']:.3f}",
            f"{r['sync_resumed_s_mean']:.3f}",
            f"{r['samples_per_s']:.1f}",
            str(r["partial_trajectories"]),
        )
    console.print(table)
    c, d = results["c"], results["d"]
    ratio = c["sync_pause_s_mean"] / max(d["sync_pause_s_mean"], 1e-9)
    console.print(
        f"mean sync pause: mode (c) {c['sync_pause_s_mean'] * 1e3:.0f} ms, "
        f"mode (d) {d['sync_pause_s_mean'] * 1e3:.0f} ms: (c)/(d) = {ratio:.2f}x; "
        f"whole sync (SyncRequested -> last RolloutResumed): "
        f"(c) {c['sync_resumed_s_mean'] * 1e3:.0f} ms, (d) {d['sync_resumed_s_mean'] * 1e3:.0f} ms; "
        f"throughput (d)/(c) = {d['samples_per_s'] / c['samples_per_s']:.2f}x"
    )
    return {"c": c, "d": d, "pause_ratio_c_over_d": ratio}


def tracing_cost(config: str | None, overrides: list[str], console: Console) -> dict[str, Any]:
    """Samples/s of the same sim workload (mode d) with tracing off, then on (file exporter).

    Tracing on means every sample's span tree, a send span and a traceparent header per
    message, and the step links, all exported by a background thread, which is what a run
    traced to a collector pays (the network hop aside).
    """
    from asyncrl.ops.launcher import run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, dict[str, Any]] = {}
    for label, on in (("off", "false"), ("on", "true")):
        cfg = load_config(
            config,
            [
                *SYNC_PAUSE_DEFAULTS,
                "async_training.partial_rollout=true",
                *overrides,
                f"tracing.enabled={on}",
                "tracing.exporter=file",
                f"run_id=tracing-{label}-{stamp}",
            ],
        )
        console.rule(f"tracing {label}")
        summary = run(cfg, console)
        active_s = summary["elapsed_s"] - (summary["first_worker_joined_s"] or 0.0)
        spans = sum(1 for f in (cfg.run_dir / "traces").glob("*.jsonl") for _ in f.open())
        results[label] = {
            **summary,
            "samples_per_s": summary["samples_trained"] / active_s,
            "spans": spans,
        }
    off, on = results["off"], results["on"]
    ratio = on["samples_per_s"] / off["samples_per_s"]
    console.print(
        f"samples/s: tracing off {off['samples_per_s']:.2f}, on {on['samples_per_s']:.2f} "
        f"({on['spans']} spans): on/off = {ratio:.3f}"
    )
    return {"off": off, "on": on, "ratio_on_over_off": ratio}


LEARN_DEFAULTS = ["trainer.total_training_steps=400"]
LEARN_TARGET = 0.9
"""The target when the config sets none (the demo's is 0.9, the calculator's 0.8)."""


def _async_curve(cfg: RunConfig) -> list[tuple[float, float]]:
    """(seconds since the trainer started, held-out accuracy) at each evaluation."""
    return [(r["perf/elapsed_s"], r["val/accuracy"]) for r in step_rows(cfg) if "val/accuracy" in r]


def learn(config: str | None, overrides: list[str], console: Console) -> dict[str, Any]:
    """Wall time to the target accuracy: colocated sync vs async mode (c) vs mode (d).

    All three start from the same cached warm start and run the same GRPO settings; times
    exclude the warm start and, for the async modes, process start-up (they count from the
    first worker's join). Colocated sync generates and trains in one process with all the
    machine's cores; the async modes run a trainer and a worker process (one core each).
    Any task: with ``--config calculator`` all three run the agent loop and its tool calls.
    """
    import os

    import torch

    from asyncrl.consumers.colocated import main as colocated
    from asyncrl.ops.launcher import prepare_policy, run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = [*LEARN_DEFAULTS, *overrides]
    if load_config(config, base).trainer.target_accuracy is None:
        base.append(f"trainer.target_accuracy={LEARN_TARGET}")
    results: dict[str, dict[str, Any]] = {}

    cfg = load_config(config, [*base, f"run_id=learn-sync-{stamp}"])
    prepare_policy(cfg, console)
    console.rule("colocated sync (one process)")
    torch.set_num_threads(os.cpu_count() or 1)
    history = colocated(cfg, log=console.log)
    evals = [(h["time_s"], h["val_acc"]) for h in history if "val_acc" in h]
    results["colocated sync"] = _learn_row(cfg, evals, history[-1]["step"])

    for mode, partial in (("c", "false"), ("d", "true")):
        cfg = load_config(
            config,
            [*base, f"async_training.partial_rollout={partial}", f"run_id=learn-{mode}-{stamp}"],
        )
        console.rule(f"async mode ({mode})")
        summary = run(cfg, console)
        # From the first worker's join, as colocated starts with its model loaded; the
        # initial accuracy (measured before) at 0.
        t0 = summary.get("first_worker_joined_s") or 0.0
        curve = [(t - t0, acc) for t, acc in _async_curve(cfg)]
        if summary.get("val/accuracy_initial") is not None:
            curve.insert(0, (0.0, summary["val/accuracy_initial"]))
        results[f"async ({mode})"] = _learn_row(cfg, curve, summary["step"])

    table = Table(title=f"time to held-out accuracy {cfg.trainer.target_accuracy}")
    for col in ("setup", "steps", "time to target s", "final accuracy", "speedup"):
        table.add_column(col, justify="right")
    ref = results["colocated sync"]["time_to_target_s"]
    for name, r in results.items():
        t = r["time_to_target_s"]
        table.add_row(
            name,
            str(r["steps"]),
            "-" if t is None else f"{t:.1f}",
            f"{r['final_accuracy']:.3f}",
            "-" if t is None or ref is None else f"{ref / t:.2f}x",
        )
    console.print(table)
    out = Path(cfg.output_dir) / f"bench-learn-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    plot = line_plot(
        {name: r["curve"] for name, r in results.items()},
        out.with_suffix(".png"),
        title="held-out accuracy of the tiny model (warm start excluded)",
        xlabel="wall time, s",
        ylabel="held-out accuracy",
        hline=cfg.trainer.target_accuracy,
        hline_label="target",
    )
    console.print(f"figures: {out}; accuracy curves: {plot}")
    return results


def _learn_row(cfg: RunConfig, curve: list[tuple[float, float]], steps: int) -> dict[str, Any]:
    target = cfg.trainer.target_accuracy or 1.0
    reached = [t for t, acc in curve if acc >= target]
    return {
        "steps": steps,
        "time_to_target_s": reached[0] if reached else None,
        "final_accuracy": curve[-1][1] if curve else float("nan"),
        "curve": curve,
    }
