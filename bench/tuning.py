"""``asyncrl bench tuning``: time to the target accuracy over a grid of
``async_training.staleness_threshold`` x ``trigger_parameter_sync_step``, next to colocated
sync, medians over ``--seeds`` (docs/tuning.md shows the curve).

The async setup is the config's (plus the overrides): say ``async_training.in_flight_update=
true`` to sweep mode (d) without pauses. ``require_batches`` stays the config's.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from asyncrl.bench import flags
from asyncrl.bench.learn import COLOCATED, compare, note_overridden

STALENESS = (0.5, 1.0, 2.0)
TRIGGER = (1, 2, 4)


def tuning(
    config: str | None,
    overrides: list[str],
    console: Console,
    seeds: int = 1,
    staleness: tuple[float, ...] = STALENESS,
    trigger: tuple[int, ...] = TRIGGER,
) -> dict[str, Any]:
    """Returns setup name (``staleness=S trigger=T``) -> its median row (bench.learn)."""
    note_overridden(
        overrides,
        {
            "async_training.staleness_threshold": "the grid's (--staleness)",
            "async_training.trigger_parameter_sync_step": "the grid's (--trigger)",
        },
        "tuning",
        console,
    )
    setups: dict[str, list[str]] = {COLOCATED: []}
    for s in staleness:
        for t in trigger:
            setups[f"staleness={s:g} trigger={t}"] = [
                f"async_training.staleness_threshold={s}",
                f"async_training.trigger_parameter_sync_step={t}",
            ]
    results, out = compare(config, overrides, console, setups, seeds, "tuning")
    console.print(f"figures: {out}")
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench tuning``: its description and flags."""
    p.description = (
        "Time to the target accuracy over a grid of staleness_threshold x "
        "trigger_parameter_sync_step (the config's async setup), next to colocated sync."
    )
    flags.add_seeds(p)
    flags.add_staleness(p, "the grid's (default 0.5,1,2)")
    p.add_argument(
        "--trigger",
        help="comma-separated async_training.trigger_parameter_sync_step values (default 1,2,4)",
    )


def main(args: argparse.Namespace, console: Console) -> None:
    """``asyncrl bench tuning``: its flags checked, then the grid."""
    seeds = flags.seeds(args)
    staleness = flags.staleness(args) or STALENESS
    trigger = flags.comma_list("--trigger", args.trigger, int, 1, "whole numbers", "1,2,4")
    tuning(args.config, args.overrides, console, seeds, staleness, trigger or TRIGGER)
