"""Where a run's step time went, from its metrics.jsonl: one line of means (the first step,
which waits for the pipeline to fill, left out). Used by tools/gpu_check.sh.

    python tools/step_times.py runs/demo/metrics.jsonl
"""

from __future__ import annotations

import json
import math
import statistics
import sys


def main(path: str) -> str:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    steps = [r for r in rows if "step" in r][1:]

    def mean(key: str) -> float:
        values = [r[key] for r in steps if key in r]
        return statistics.mean(values) if values else math.nan

    return (
        f"{path}: {len(steps)} steps, s/step {mean('perf/time_per_step'):.3f}, update "
        f"{mean('timing_s/update_actor'):.3f}, wait for samples {mean('timing_s/gen'):.3f}, "
        f"sync {mean('timing_s/param_sync'):.3f} (transfer "
        f"{mean('timing_s/param_sync_transfer'):.3f}), samples/s "
        f"{mean('perf/samples_per_s'):.1f}, idle trainer {mean('trainer/idle_ratio'):.2f}, "
        f"rollout {mean('rollouter/idle_ratio'):.2f}"
    )


if __name__ == "__main__":
    print(main(sys.argv[1]))
