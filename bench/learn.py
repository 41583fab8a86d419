"""``asyncrl bench learn``: wall time to the target held-out accuracy, colocated sync vs async
mode (c) vs mode (d) vs mode (d) with in-flight weight updates, from one invocation (the curves
on one PNG).

One run of a setup says little: with another ``trainer.seed`` (the sampling draws; every
setup reads the prompts in data.seed's order) the demo's colocated baseline reaches 0.9 in
90-120 steps and an async run in 70-180. ``--seeds N`` runs every setup with N seeds, one seed at a time through all the
setups (so a drift in the machine's load touches each alike), and compares medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench import flags
from asyncrl.bench.sync_pause import step_rows, trainer_restarts
from asyncrl.config import RunConfig, load_config
from asyncrl.config.overrides import override_key
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
COLOCATED = "colocated sync"
"""The baseline's row: the faster of its runs with one torch thread and with every core."""


def note_overridden(
    overrides: list[str], keys: dict[str, str], bench: str, console: Console
) -> list[str]:
    """Say which command-line overrides the benchmark replaces in each of its setups (``keys``:
    the key -> what sets it), and return them: they were replaced without a word (``bench
    tuning async_training.trigger_parameter_sync_step=2`` ran the grid's 1, 2 and 4). A note,
    not an error: a shared override list (the tests' quick policy) may hold them."""
    given = [o for o in overrides if override_key(o) in keys]
    for o in given:
        key = override_key(o)
        console.print(
            f"[yellow]bench {bench} sets {key} itself, {keys[key]}: {o} is not applied[/]"
        )
    return given


def colocated_threads() -> list[int]:
    """The torch thread counts the colocated baseline runs with: one, and every core. Which
    is faster depends on the machine and on what else runs on it. On an idle 2-core Xeon the
    demo's colocated loop reached 0.9 in 2.7 s with two threads and 3.5 s with one (medians
    of 3 seeds); with another process spinning on one core, 14.5 s with two and 4.1 s with
    one, and a baseline run only with every core made async look 1.5x faster than colocated
    (the async roles run one thread each)."""
    return sorted({1, os.cpu_count() or 1})


def colocated_name(threads: int) -> str:
    return f"{COLOCATED}, {threads} thread{'s' if threads > 1 else ''}"


def best_colocated(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``results`` with the faster colocated row (the median time to the target; one that
    got there over one that did not) as ``COLOCATED`` first, labelled with its thread count,
    and the slower one(s) after it under their own names."""
    if not all(colocated_name(n) in results for n in colocated_threads()):
        return results
    variants = {n: results[colocated_name(n)] for n in colocated_threads()}

    def time_of(n: int) -> float:
        t = variants[n]["time_to_target_s"]
        return float("inf") if t is None else t

    best = min(variants, key=time_of)
    named = {colocated_name(n) for n in variants}
    ordered = {COLOCATED: {**variants[best], "threads": best}}
    ordered.update({colocated_name(n): r for n, r in variants.items() if n != best})
    ordered.update({k: r for k, r in results.items() if k not in named})
    return ordered


def learn(
    config: str | None, overrides: list[str], console: Console, seeds: int = 1
) -> dict[str, Any]:
    """Wall time to the target accuracy: colocated sync vs async mode (c) vs mode (d).

    All start from the same cached warm start and run the same GRPO settings; times exclude
    the warm start and, for the async modes, process start-up (they count from the first
    worker's join). Colocated sync generates and trains in one process, once with one torch
    thread and once with all the machine's cores; the faster is the baseline
    (``colocated_threads``). The async modes run a trainer and a worker process (one core
    each).
    Any task: with ``--config calculator`` all run the agent loop and its tool calls.
    Returns setup -> the median row over the seeds (``runs``: each seed's row).
    """
    note_overridden(
        overrides,
        {"async_training.partial_rollout": "false in async (c), true in the (d) rows"},
        "learn",
        console,
    )
    setups = {COLOCATED: [], **{f"async ({m})": s for m, s in ASYNC_SETUPS.items()}}
    results, out = compare(config, overrides, console, setups, seeds, "learn")
    target = results[COLOCATED]["target"]
    plot = line_plot(
        {name: r["runs"][0]["curve"] for name, r in results.items()},
        out.with_suffix(".png"),
        title="held-out accuracy (warm start excluded; first seed)",
        xlabel="wall time, s",
        ylabel="held-out accuracy",
        hline=target,
        hline_label="target",
    )
    console.print(f"figures: {out}; accuracy curves: {plot}")
    return results


def compare(
    config: str | None,
    overrides: list[str],
    console: Console,
    setups: dict[str, list[str]],
    seeds: int,
    bench: str,
) -> tuple[dict[str, dict[str, Any]], Path]:
    """Run ``setups`` (``run_setups``), print the medians side by side and write them to
    ``bench-<bench>-<stamp>.json`` in the output dir; returns them and that path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = run_setups(config, overrides, console, setups, seeds, stamp)
    results = best_colocated({name: median_row(rows) for name, rows in runs.items()})
    target = results[COLOCATED]["target"]
    print_table(console, f"time to held-out accuracy {target} ({_seeds_note(seeds)})", results)
    out = Path(load_config(config, overrides).output_dir) / f"bench-{bench}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    return results, out


def run_setups(
    config: str | None,
    overrides: list[str],
    console: Console,
    setups: dict[str, list[str]],
    seeds: int,
    stamp: str,
) -> dict[str, list[dict[str, Any]]]:
    """Every setup once per seed (``trainer.seed`` + 0, 1, ...), seed by seed; the one named
    ``colocated sync`` runs the single-process baseline, once per ``colocated_threads()``
    (rows ``colocated_name(n)``), the others ``asyncrl run``."""
    base = [*LEARN_DEFAULTS, *overrides]
    given = load_config(config, base).trainer
    if given.target_accuracy is None:
        base.append(f"trainer.target_accuracy={LEARN_TARGET}")
    # (row, its overrides, how it runs): the colocated setup once per thread count
    plan: list[tuple[str, list[str], Callable[[RunConfig, Console], dict[str, Any]]]] = []
    for name, settings in setups.items():
        if name == COLOCATED:
            for n in colocated_threads():
                plan.append((colocated_name(n), settings, functools.partial(_colocated, threads=n)))
        else:
            plan.append((name, settings, _async))
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row, _, _ in plan}
    # Every run's config is loaded before the first starts: a setup that cannot run (bench
    # tuning --trigger 0, a grid cell the overrides contradict) stops the bench at once, not
    # after the runs before it took minutes.
    todo: list[tuple[str, int, RunConfig, Callable[[RunConfig, Console], dict[str, Any]]]] = []
    for i in range(seeds):
        seed = given.seed + i
        for row, settings, run in plan:
            slug = re.sub(r"[^A-Za-z0-9_-]", "", row.replace(" ", "-"))  # a valid run_id
            cfg = load_config(
                config,
                [*base, *settings, f"trainer.seed={seed}", f"run_id=learn-{slug}-{seed}-{stamp}"],
            )
            todo.append((row, seed, cfg, run))
    for row, seed, cfg, run in todo:
        console.rule(f"{row}, trainer.seed={seed}")
        runs[row].append({"seed": seed, **run(cfg, console)})
    return runs


def _colocated(cfg: RunConfig, console: Console, threads: int) -> dict[str, Any]:
    import torch

    from asyncrl.consumers.colocated import main as colocated
    from asyncrl.launch.setup import prepare_policy

    prepare_policy(cfg, console)
    torch.set_num_threads(threads)
    history = colocated(cfg, log=console.log)
    evals = [(h["time_s"], h["val_acc"]) for h in history if "val_acc" in h]
    return _row(cfg, evals, history[-1]["step"])


def _async(cfg: RunConfig, console: Console) -> dict[str, Any]:
    from asyncrl.launch.launcher import run

    summary = run(cfg, console)
    row = async_row(cfg, summary, step_rows(cfg))
    if row.get("trainer_restarts"):
        console.log(
            f"[yellow]{cfg.run_id}: the trainer died and was restarted from its checkpoint "
            f"({row['trainer_restarts']}x, {cfg.run_dir / 'logs' / 'trainer.log'} says why); "
            "its clock restarted with it, so this run's time to the target is not measured "
            "and it counts as not reaching it"
        )
    return row


def async_row(
    cfg: RunConfig, summary: dict[str, Any], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """An async run's row from its summary and step rows. A run whose trainer was restarted
    has no time to the target: the restarted trainer's clock (``perf/elapsed_s``) starts
    again at its checkpoint, and read as one clock it gave a 10x "speedup"."""
    # From the first worker's join, as colocated starts with its model loaded; the initial
    # accuracy (measured before) at 0.
    t0 = summary.get("first_worker_joined_s") or 0.0
    curve = [(r["perf/elapsed_s"] - t0, r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    if summary.get("val/accuracy_initial") is not None:
        curve.insert(0, (0.0, summary["val/accuracy_initial"]))
    row = _row(cfg, curve, summary["step"])
    updates = [r["timing_s/update_actor"] for r in rows if "timing_s/update_actor" in r]
    if updates and row["time_to_target_s"]:
        # The trainer's own compute over the steps to the target: what the run would take if
        # it never waited for samples, syncs or evaluations.
        row["update_share"] = statistics.median(updates) * row["steps"] / row["time_to_target_s"]
    # Where the rest goes: the trainer's wait for samples a step, the rollout side's idle share.
    for key, name in (
        ("timing_s/gen", "wait_s"),
        ("rollouter/idle_ratio", "rollouter_idle"),
        ("rollouter/budget_idle_ratio", "budget_idle"),
        ("rollouter/engine_occupancy", "engine_full"),
        ("rollouter/budget_unfilled_ratio", "budget_unfilled"),
    ):
        values = [r[key] for r in rows if key in r]
        if values:
            row[name] = statistics.mean(values)
    restarted = trainer_restarts(summary)
    if restarted:
        row.update(time_to_target_s=None, update_share=None, trainer_restarts=restarted)
    return row


def _row(cfg: RunConfig, curve: list[tuple[float, float]], steps: int) -> dict[str, Any]:
    target = cfg.trainer.target_accuracy or 1.0
    reached = [t for t, acc in curve if acc >= target]
    return {
        "steps": steps,
        "target": target,
        "time_to_target_s": reached[0] if reached else None,
        "final_accuracy": curve[-1][1] if curve else float("nan"),
        "curve": curve,
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One setup over its seeds: medians of the runs that reached the target (steps, time,
    final accuracy), how many did, the fastest and slowest, and every run."""
    reached = [r for r in rows if r["time_to_target_s"] is not None]
    times = [r["time_to_target_s"] for r in reached]

    def med(key: str, of: list[dict[str, Any]]) -> float | None:
        values = [r[key] for r in of if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "target": rows[0]["target"],
        "reached": len(reached),
        "runs_n": len(rows),
        "steps": med("steps", reached or rows),
        "time_to_target_s": statistics.median(times) if times else None,
        "fastest_s": min(times, default=None),
        "slowest_s": max(times, default=None),
        "final_accuracy": med("final_accuracy", rows),
        "update_share": med("update_share", reached),
        "wait_s": med("wait_s", reached),
        "rollouter_idle": med("rollouter_idle", reached),
        "budget_idle": med("budget_idle", reached),
        "engine_full": med("engine_full", reached),
        "budget_unfilled": med("budget_unfilled", reached),
        "runs": rows,
    }


def print_table(console: Console, title: str, results: dict[str, dict[str, Any]]) -> None:
    """Medians side by side; speedup = the colocated median over the setup's. ``update
    share``: of an async run's time to the target, the part its trainer spent updating (the
    rest it waited for samples, synced or evaluated); ``wait s/step``: its trainer's wait for
    samples a step; ``rollout idle (budget)``: the share of the time its workers had nothing to
    generate, and of it the share with the version's budget spent; ``engine full (budget)``:
    how full their engines ran, and the empty share with the budget spent."""
    table = Table(title=title)
    cols = (
        "setup",
        "at target",
        "steps",
        "time to target s",
        "s/step",
        "update share",
        "wait s/step",
        "rollout idle (budget)",
        "engine full (budget)",
        "final acc",
        "speedup",
    )
    for col in cols:
        table.add_column(col, justify="right")
    ref = results[COLOCATED]["time_to_target_s"] if COLOCATED in results else None
    for name, r in results.items():
        t, steps = r["time_to_target_s"], r["steps"]
        spread = ""
        if r["runs_n"] > 1 and t is not None:
            spread = f" ({r['fastest_s']:.1f}-{r['slowest_s']:.1f})"
        label = name if r.get("threads") is None else f"{colocated_name(r['threads'])} (best)"
        table.add_row(
            label,
            f"{r['reached']}/{r['runs_n']}",
            "-" if steps is None else f"{steps:g}",
            "-" if t is None else f"{t:.1f}{spread}",
            "-" if t is None or not steps else f"{t / steps:.3f}",
            "-" if r.get("update_share") is None else f"{r['update_share']:.2f}",
            "-" if r.get("wait_s") is None else f"{r['wait_s']:.3f}",
            _idle(r),
            _share(r, "engine_full", "budget_unfilled"),
            f"{r['final_accuracy']:.3f}",
            "-" if t is None or ref is None else f"{ref / t:.2f}x",
        )
    console.print(table)


def _idle(r: dict[str, Any]) -> str:
    return _share(r, "rollouter_idle", "budget_idle")


def _share(r: dict[str, Any], key: str, budget_key: str) -> str:
    """``key``'s median, and in brackets the part of it with the budget spent."""
    if r.get(key) is None:
        return "-"
    budget = r.get(budget_key)
    return f"{r[key]:.2f}" + ("" if budget is None else f" ({budget:.2f})")


def _seeds_note(n: int) -> str:
    return "one seed" if n == 1 else f"medians of {n} seeds"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench learn``: its description and flags."""
    p.description = (
        "Wall time to the target held-out accuracy, colocated sync (with one torch thread and "
        "with every core: the faster is the baseline) vs async (c) vs (d) vs (d) with "
        "in-flight weight updates, and the accuracy curves on one plot (PNG)."
    )
    flags.add_seeds(p)


def main(args: argparse.Namespace, console: Console) -> None:
    learn(args.config, args.overrides, console, seeds=flags.seeds(args))
