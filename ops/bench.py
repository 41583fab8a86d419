"""``asyncrl bench``: measurements printed side by side from one invocation.

``sync-pause``: the same workload in mode (c) and mode (d), one after the other. In mode (c) a
sync waits for every in-flight sample to finish; in mode (d) it interrupts them between two
tokens and logs them to ``partials``. The figure of merit is the time the trainer waits from
SyncRequested until every worker has paused. Generation on this machine is far faster than on
a real model, so the workload emulates decode latency (``emulated_decode_latency_s``) and keeps
few samples in flight, so that a sync finds generations under way.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.ops.config import RunConfig, load_config

SYNC_PAUSE_DEFAULTS = [
    "async_training.staleness_threshold=0.5",
    "actor_rollout_ref.rollout.emulated_decode_latency_s=0.05",
    "actor_rollout_ref.rollout.max_concurrent_samples=2",
    "trainer.total_training_steps=30",
    "trainer.target_accuracy=null",
    "trainer.test_freq=0",
    "output_dir=runs/bench",
]


def _partial_totals(cfg: RunConfig) -> tuple[int, int]:
    """(partial samples trained on, max span) over the run, from its metrics file.

    ``total_partial_num`` counts within a sync window (one weight version), so the run's total
    is the sum over versions of each window's last value.
    """
    per_version: dict[int, int] = {}
    span = 0
    with open(cfg.run_dir / "metrics.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if "step" not in row:
                continue
            num = int(row.get("fully_async/partial/total_partial_num", 0))
            per_version[row["version"]] = max(per_version.get(row["version"], 0), num)
            span = max(span, int(row.get("fully_async/partial/max_partial_span", 0)))
    return sum(per_version.values()), span


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
        n_partial, span = _partial_totals(cfg)
        results[mode] = {
            **summary,
            "partial_samples": n_partial,
            "max_partial_span": span,
            "samples_per_s": summary["samples_trained"] / summary["elapsed_s"],
        }
    table = Table(title="sync pause: mode (c) vs mode (d), same workload")
    for col in ("mode", "syncs", "pause mean s", "pause max s", "samples/s", "partial samples"):
        table.add_column(col, justify="right")
    for mode, r in results.items():
        table.add_row(
            mode,
            str(r["syncs"]),
            f"{r['sync_pause_s_mean']:.3f}",
            f"{r['sync_pause_s_max']:.3f}",
            f"{r['samples_per_s']:.1f}",
            str(r["partial_samples"]),
        )
    console.print(table)
    c, d = results["c"], results["d"]
    ratio = c["sync_pause_s_mean"] / max(d["sync_pause_s_mean"], 1e-9)
    console.print(
        f"mean sync pause: mode (c) {c['sync_pause_s_mean'] * 1e3:.0f} ms, "
        f"mode (d) {d['sync_pause_s_mean'] * 1e3:.0f} ms: (c)/(d) = {ratio:.2f}x; "
        f"throughput (d)/(c) = {d['samples_per_s'] / c['samples_per_s']:.2f}x"
    )
    return {"c": c, "d": d, "pause_ratio_c_over_d": ratio}
