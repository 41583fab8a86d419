"""``asyncrl bench tracing``: what tracing costs, samples/s of one workload with it off, then on."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console

from asyncrl.bench.sync_pause import SYNC_PAUSE_DEFAULTS, one_trainer
from asyncrl.config import load_config


def tracing_cost(config: str | None, overrides: list[str], console: Console) -> dict[str, Any]:
    """Samples/s of the same sim workload (mode d) with tracing off, then on (file exporter).

    Tracing on means every sample's span tree, a send span and a traceparent header per
    message, and the step links, all exported by a background thread, which is what a run
    traced to a collector pays (the network hop aside).
    """
    from asyncrl.launch.launcher import run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, dict[str, Any]] = {}
    for label, enabled in (("off", "false"), ("on", "true")):
        cfg = load_config(
            config,
            [
                *SYNC_PAUSE_DEFAULTS,
                "async_training.partial_rollout=true",
                *overrides,
                f"tracing.enabled={enabled}",
                "tracing.exporter=file",
                f"run_id=tracing-{label}-{stamp}",
            ],
        )
        console.rule(f"tracing {label}")
        summary = one_trainer(cfg, run(cfg, console))
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench tracing``: its description (it takes no flags of its own)."""
    p.description = "Samples/s of the sim workload with OpenTelemetry tracing off, then on."


def main(args: argparse.Namespace, console: Console) -> None:
    tracing_cost(args.config, args.overrides, console)
