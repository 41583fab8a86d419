"""``asyncrl bench learn``: wall time to the target held-out accuracy, colocated sync vs async
mode (c) vs mode (d) vs mode (d) with in-flight weight updates, from one invocation (the curves
on one PNG)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench.sync_pause import step_rows
from asyncrl.config import RunConfig, load_config
from asyncrl.ops.plots import line_plot

LEARN_DEFAULTS = ["trainer.total_training_steps=400"]
ASYNC_SETUPS = {
    "c": ["async_training.partial_rollout=false"],
    "d": ["async_training.partial_rollout=true"],
    # mode (d) without pauses: weights swapped in between two tokens
    "d in flight": ["async_training.partial_rollout=true", "async_training.in_flight_update=true"],
}
"""The async setups run after colocated sync; the config (and overrides) give the rest."""
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
    from asyncrl.launch.launcher import prepare_policy, run

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

    for mode, settings in ASYNC_SETUPS.items():
        name = mode.replace(" ", "-").replace("(", "").replace(")", "")
        cfg = load_config(config, [*base, *settings, f"run_id=learn-{name}-{stamp}"])
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
