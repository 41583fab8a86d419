"""``asyncrl bench offpolicy``: the stress ablation of issue 17, side by side from one invocation.

The same high-staleness async run (mode (d): ``staleness_threshold=2``,
``trigger_parameter_sync_step=4``, partial rollout) four times, from the same cached warm
start, for the same number of steps: without correction, with decoupled PPO (the trainer's
proximal log-probs and token importance weights, verl's mode (d) recipe), with DAPO's dynamic
sampling, and with both. Printed: held-out accuracy (final, best, time and steps to the target),
how stale the trained samples were, the mismatch KL and importance weights the correction saw,
the groups filtered; plotted: the four accuracy curves against step and against wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench.sync_pause import step_rows, trainer_restarts
from asyncrl.config import RunConfig, load_config
from asyncrl.ops.plots import line_plot

OFFPOLICY_DEFAULTS = [
    "async_training.staleness_threshold=2",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.partial_rollout=true",
    "trainer.total_training_steps=160",
    "trainer.test_freq=4",
    "trainer.target_accuracy=null",  # every variant runs every step: curves of equal length
    "output_dir=runs/bench",
]
OFFPOLICY_TARGET = 0.9
"""The accuracy the table times each variant to (on the curve; the runs do not stop there)."""
CORRECTION = [
    "async_training.compute_prox_log_prob=true",
    "algorithm.rollout_correction.rollout_is=token",
]
DYNAMIC = ["algorithm.filter_groups.enable=true"]
VARIANTS: dict[str, list[str]] = {
    "no correction": [],
    "decoupled PPO (IS)": CORRECTION,
    "dynamic sampling": DYNAMIC,
    "decoupled PPO + dynamic sampling": [*CORRECTION, *DYNAMIC],
}


def offpolicy(config: str | None, overrides: list[str], console: Console) -> dict[str, Any]:
    """Run the four variants one after the other; print, plot and return their figures.
    ``overrides`` apply to all four (after the stress defaults), e.g. the step count."""
    from asyncrl.launch.launcher import run
    from asyncrl.launch.setup import prepare_policy

    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, dict[str, Any]] = {}
    # Every variant's config is loaded before the first runs: an override only the corrected
    # variants take (a bad rollout_rs) fails at once, not after the first variant's run.
    configs: dict[str, RunConfig] = {}
    for i, (name, extra) in enumerate(VARIANTS.items()):
        # rollout_correction keys (e.g. adding rollout_rs) go to the corrected variants only:
        # without compute_prox_log_prob there is nothing for them to correct
        mine = [o for o in overrides if extra[:1] == CORRECTION[:1] or not _corrects(o)]
        configs[name] = load_config(
            config,
            [*OFFPOLICY_DEFAULTS, *mine, *extra, f"run_id=offpolicy-{i}-{stamp}"],
        )
    for i, (name, cfg) in enumerate(configs.items()):
        if i == 0:
            prepare_policy(cfg, console)
        console.rule(name)
        summary = run(cfg, console)
        results[name] = _row(cfg, summary)
    _table(results, console)
    out = Path(cfg.output_dir) / f"bench-offpolicy-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    at = cfg.async_training
    stress = f"staleness {at.staleness_threshold:g}, trigger {at.trigger_parameter_sync_step}"
    plots = [
        line_plot(
            {name: r[key] for name, r in results.items()},
            out.with_name(f"{out.stem}-{suffix}.png"),
            title=f"held-out accuracy under stress ({stress})",
            xlabel=xlabel,
            ylabel="held-out accuracy",
            hline=OFFPOLICY_TARGET,
            hline_label="target",
        )
        for key, suffix, xlabel in (
            ("curve_step", "step", "step"),
            ("curve_time", "time", "wall time since the first worker joined, s"),
        )
    ]
    console.print(f"figures: {out}; accuracy curves: {', '.join(map(str, plots))}")
    return results


def _corrects(override: str) -> bool:
    return override.lstrip("+~").startswith("algorithm.rollout_correction.")


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def _row(cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    rows = step_rows(cfg)
    t0 = summary.get("first_worker_joined_s") or 0.0
    initial = summary.get("val/accuracy_initial")
    curve_step = [(r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    curve_time = [
        (r["perf/elapsed_s"] - t0, r["val/accuracy"]) for r in rows if "val/accuracy" in r
    ]
    if initial is not None:
        curve_step.insert(0, (0, initial))
        curve_time.insert(0, (0.0, initial))
    reached = [i for i, (_, acc) in enumerate(curve_step) if acc >= OFFPOLICY_TARGET]
    # A restarted trainer's clock starts again at its checkpoint: its times are not the run's.
    timed = not trainer_restarts(summary)
    trained = sum(int(v) for r in rows for k, v in r.items() if "staleness/count_" in k)
    stale = sum(
        int(v)
        for r in rows
        for k, v in r.items()
        if "staleness/count_" in k and not k.endswith("count_0")
    )
    return {
        "steps": summary["step"],
        "final_accuracy": curve_step[-1][1] if curve_step else None,
        "best_accuracy": max((a for _, a in curve_step), default=None),
        "steps_to_target": curve_step[reached[0]][0] if reached else None,
        "time_to_target_s": curve_time[reached[0]][0] if reached and timed else None,
        "elapsed_s": summary["elapsed_s"] if timed else None,
        "stale_share": stale / trained if trained else 0.0,
        "staleness_mean": _mean(rows, "fully_async/staleness/mean"),
        "mismatch_kl": _mean(rows, "rollout_corr/kl"),
        "is_weight_mean": _mean(rows, "rollout_corr/rollout_is_mean"),
        "is_truncated_share": _mean(rows, "rollout_corr/rollout_is_ratio_fraction_high"),
        "filtered_groups": summary.get("filtered"),
        "filtered_share": _mean(rows, "filter_groups/filtered_ratio"),
        "pg_clipfrac": _mean(rows, "actor/pg_clipfrac"),
        "curve_step": curve_step,
        "curve_time": curve_time,
    }


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(results: dict[str, dict[str, Any]], console: Console) -> None:
    table = Table(title=f"off-policy stress ablation (target accuracy {OFFPOLICY_TARGET})")
    cols = (
        ("variant", None, "s"),
        ("steps", "steps", "d"),
        ("final acc", "final_accuracy", ".3f"),
        ("best acc", "best_accuracy", ".3f"),
        ("steps to target", "steps_to_target", "d"),
        ("s to target", "time_to_target_s", ".1f"),
        ("stale share", "stale_share", ".0%"),
        ("staleness mean", "staleness_mean", ".2f"),
        ("KL rollout||trainer", "mismatch_kl", ".4f"),
        ("IS weight mean", "is_weight_mean", ".3f"),
        ("truncated", "is_truncated_share", ".1%"),
        ("groups filtered", "filtered_groups", "d"),
        ("clipfrac", "pg_clipfrac", ".3f"),
    )
    for title, _, _ in cols:
        table.add_column(title, justify="right")
    for name, r in results.items():
        table.add_row(name, *(_fmt(r[key], spec) for _, key, spec in cols[1:] if key))
    console.print(table)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench offpolicy``: its description (it takes no flags of its own)."""
    p.description = (
        "The same high-staleness run (staleness 2, trigger 4, partial rollout) without "
        "correction, with decoupled PPO (proximal log-probs, token importance weights), with "
        "dynamic sampling (filter_groups) and with both: accuracy curves, staleness, mismatch "
        "KL, weights and filtered groups side by side."
    )


def main(args: argparse.Namespace, console: Console) -> None:
    offpolicy(args.config, args.overrides, console)
