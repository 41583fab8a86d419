"""``asyncrl bench modes``: verl's 128-GPU mode table (seeds ``001``) on one machine.

Every setup runs the ``sim`` engine (see ``producers/engines/sim.py``) on one workload
(``bench/workloads.py``: ``long-tail``, or ``seed``, the seed's own figures time-scaled) for
the same number of *steps*, a step being what the seed's table counts: one colocated training
step of ``B`` samples, or one sync window of the async trainer (``trigger x required = B``
samples, in ``trigger`` local updates). Resources follow the seed's "128 colocated vs 64:64":
two units in all. Colocated sync uses both units for each phase in turn: rollout with twice a
replica's capacity, then training (the workload's colocated time per sample). The async setups
give one unit to a rollout worker (one replica) and one to the trainer, and run through the
whole real system (broker, control events, budget, staleness, interrupts).

Steady state: the first step of every setup is a warm-up, not counted (the async pipeline
fills, as it does once in the seed's 400 steps); times, speedups and efficiency are over the
other steps. Efficiency is the ideal time over the measured one. Ideal: the modelled work of
the samples trained on in those steps, each kind over its resources: for the async setups the
slower of rollout (tokens x decode_step_s / capacity) and training (samples x
train_s_per_sample); for colocated sync the two phases add up, since they cannot overlap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench import flags
from asyncrl.bench.learn import note_overridden
from asyncrl.bench.sync_pause import one_trainer, partial_totals, step_rows
from asyncrl.bench.workloads import (
    SEED_ROWS,
    Setup,
    Workload,
    long_tail,
    seed,
    seed_speedup,
    seed_speedup_equal_tokens,
)
from asyncrl.config import RunConfig, load_config
from asyncrl.config.overrides import override_key
from asyncrl.telemetry.metrics import stale_in_step

WORKLOADS = ("seed", "long-tail")


def _setup_overrides(w: Workload, setup: Setup) -> list[str]:
    """A setup's keys, after the user's overrides. A user's
    ``async_training.in_flight_update=true`` holds in the partial-rollout rows and is turned
    off in the others, which cannot update in flight (mode (d) only)."""
    trigger, require, staleness, partial = setup
    keys = [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={w.mini_batch}",
        f"async_training.require_batches={require}",
        f"async_training.trigger_parameter_sync_step={trigger}",
        f"async_training.staleness_threshold={staleness}",
        f"async_training.partial_rollout={'true' if partial else 'false'}",
    ]
    return keys if partial else [*keys, "async_training.in_flight_update=false"]


def colocated_sim(
    cfg: RunConfig, steps: int, batch: int, train_s: float, console: Console | None = None
) -> dict[str, Any]:
    """Colocated sync on the same latency model: generate a whole batch (both units: twice
    the capacity), then train on it (``train_s`` per sample); no Kafka. The first step is the
    warm-up (when there are two or more). ``console``: a line per step (each takes seconds)."""
    from asyncrl.producers.engines.base import GenRequest
    from asyncrl.producers.engines.sim import SimEngine

    sim = cfg.sim.model_copy(update={"capacity": 2 * cfg.sim.capacity})
    engine = SimEngine(None, sim, vocab_size=30, eos_token_id=2)  # type: ignore[arg-type]
    n, max_len = cfg.actor_rollout_ref.rollout.n, cfg.data.max_response_length
    warmup = 1 if steps > 1 else 0
    gen_s = train_s_total = total = 0.0
    tokens = decode_steps = 0
    t_all = time.monotonic()
    for k in range(steps):
        t0 = time.monotonic()
        reqs = [
            GenRequest(f"colocated-{k}-{i}#{j}", [1], max_new_tokens=max_len)
            for i in range(batch)
            for j in range(n)
        ]
        steps_before = engine.steps
        step_tokens = sum(len(r.response_ids) for r in engine.generate(reqs))
        t1 = time.monotonic()
        time.sleep(train_s * batch)
        t2 = time.monotonic()
        if console is not None:
            console.log(
                f"step {k + 1}/{steps}{' (warm-up)' if k < warmup else ''}: {t2 - t0:.1f} s "
                f"(generate {t1 - t0:.1f} s, train {t2 - t1:.1f} s)"
            )
        if k >= warmup:
            tokens += step_tokens
            decode_steps += engine.steps - steps_before
            gen_s, train_s_total, total = gen_s + t1 - t0, train_s_total + t2 - t1, total + t2 - t0
    counted = steps - warmup
    gen_ideal = tokens * sim.decode_step_s / sim.capacity
    return {
        "total_s": time.monotonic() - t_all,
        "steady_s": total,
        "steps": counted,
        "local_updates": steps,
        "trainer_idle": gen_s / total,
        "rollouter_idle": train_s_total / total,
        "stale_samples": 0,
        "partial_ratio": 0.0,
        "ideal_s": gen_ideal + counted * batch * train_s,
        "per_step": {"gen": gen_s / counted, "train": train_s_total / counted},
        "rollout_util": gen_ideal / total,
        "train_util": counted * batch * train_s / total,
        # the engine's batch while it generates (a step's last responses decode alone), and
        # empty while the step trains
        "occupancy": tokens / max(decode_steps * sim.capacity, 1) * gen_s / total,
        "budget_unfilled": None,
    }


def _async_row(cfg: RunConfig, summary: dict[str, Any], steps: int) -> dict[str, Any]:
    """The row of an async run, from its metrics file: the steps after the first sync window."""
    trigger = cfg.async_training.trigger_parameter_sync_step
    warmup = trigger if steps > 1 else 0
    rows = step_rows(cfg)
    start = rows[warmup - 1]["perf/elapsed_s"] if warmup else summary.get("first_worker_joined_s")
    rows = rows[warmup:]
    counted = len(rows) // trigger

    def mean(key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else float("nan")

    def per_step(key: str) -> float:
        return sum(r.get(key, 0.0) for r in rows) / max(counted, 1)

    partial, _span = partial_totals(rows)
    n = cfg.actor_rollout_ref.rollout.n
    samples = len(rows) * cfg.required_samples
    tokens = sum(r["response_length/mean"] * n * cfg.required_samples for r in rows)
    rollout_ideal = tokens * cfg.sim.decode_step_s / cfg.sim.capacity
    train_ideal = samples * cfg.sim.train_s_per_sample
    steady = rows[-1]["perf/elapsed_s"] - (start or 0.0)
    where = {
        "update": per_step("timing_s/update_actor"),
        "wait for samples": per_step("timing_s/gen"),
        "sync": per_step("timing_s/param_sync"),
        "sync pause": per_step("timing_s/param_sync_pause"),
    }
    where["other"] = steady / max(counted, 1) - where["update"] - where["wait for samples"]
    where["other"] -= where["sync"]
    return {
        # from the first worker's join: process start-up is not part of a step's cost
        "total_s": summary["elapsed_s"] - (summary.get("first_worker_joined_s") or 0.0),
        "steady_s": steady,
        "steps": counted,
        "local_updates": summary["step"],
        "trainer_idle": mean("trainer/idle_ratio"),
        "rollouter_idle": mean("rollouter/idle_ratio"),
        # samples trained at least one version behind (by the oldest token), step by step
        "stale_samples": sum(stale_in_step(r) for r in rows),
        "partial_ratio": partial / max(samples * n, 1),  # of the trajectories
        "ideal_s": max(rollout_ideal, train_ideal),
        "per_step": where,
        "rollout_util": rollout_ideal / steady,
        "train_util": train_ideal / steady,
        "occupancy": mean("rollouter/engine_occupancy"),
        "budget_unfilled": mean("rollouter/budget_unfilled_ratio"),
    }


def make_workload(
    name: str, config: str | None, overrides: list[str], time_scale: float
) -> Workload:
    if name == "seed":
        return seed(config, overrides, time_scale)
    if name == "long-tail":
        return long_tail(overrides)
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")


def modes(
    config: str | None,
    overrides: list[str],
    console: Console,
    steps: int | None = None,
    ablation: bool = True,
    workload: str = "seed",
    time_scale: float = 0.01,
    only: tuple[str, ...] | None = None,
    staleness: tuple[float, ...] | None = None,
) -> dict[str, Any]:
    """Colocated sync vs modes (a)-(d), plus the staleness ablation; print and return the table.

    ``trainer.total_training_steps=N`` among the overrides sets ``steps`` (sync windows per
    run, the first a warm-up; each async run trains N x its trigger_parameter_sync_step local
    updates), so a smoke run is ``asyncrl bench modes trainer.total_training_steps=2``.
    ``time_scale``: seconds here per second of the seed, for ``workload="seed"``. ``only``:
    run these async setups alone (by the start of their names, e.g. ``("(d)",)``).
    ``staleness``: the ablation's staleness_threshold values in mode (d) (default: the
    workload's, the seed's 0.1 and 0.3).
    """
    from asyncrl.launch.launcher import run
    from asyncrl.launch.setup import prepare_policy

    note_overridden(
        overrides,
        {
            f"async_training.{key}": "each mode's own (the ablation's: --staleness)"
            for key in (
                "staleness_threshold",
                "trigger_parameter_sync_step",
                "require_batches",
                "partial_rollout",
            )
        }
        | {"actor_rollout_ref.actor.ppo_mini_batch_size": "the workload's"},
        "modes",
        console,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    given = [o for o in overrides if override_key(o) == "trainer.total_training_steps"]
    if given:  # the loader checks it (a whole number, at least 1), naming the key
        steps = load_config(config, given[-1:]).trainer.total_training_steps
        overrides = [o for o in overrides if o not in given]
        console.log(f"{steps} steps (sync windows) per setup, from trainer.total_training_steps")
    w = make_workload(workload, config, overrides, time_scale)
    if staleness is not None:
        trigger, require, _, partial = w.setups["(d) partial rollout"]
        rows = {f"(d) staleness {x:g}": (trigger, require, x, partial) for x in staleness}
        w = dataclasses.replace(w, ablation=rows)
    steps = steps or w.default_steps
    results: dict[str, dict[str, Any]] = {}

    setups = {**w.setups, **(w.ablation if ablation else {})}
    if only is not None:
        setups = {k: v for k, v in setups.items() if k.startswith(only)}
    # Every setup's config is loaded before anything runs: one that cannot run (--staleness 0
    # for the mode (d) ablation) stops the bench at once, not after the colocated baseline.
    configs: dict[str, RunConfig] = {}
    for name, setup in setups.items():
        run_id = "modes-" + name.split(")")[0].strip("(") + f"-{setup[2]}-{stamp}"
        configs[name] = load_config(
            config,
            [
                *w.overrides,
                *_setup_overrides(w, setup),
                f"trainer.total_training_steps={steps * setup[0]}",  # a step: one sync window
                f"run_id={run_id.replace('.', '_')}",
            ],
        )
        assert configs[name].samples_per_version == w.batch, (name, w.batch)

    cfg = load_config(config, [*w.overrides, f"run_id=modes-colocated-{stamp}"])
    in_flight = cfg.async_training.in_flight_update
    prepare_policy(cfg, console)  # once, before the async runs start their processes
    console.rule("colocated sync (modelled in one process, both units)")
    results["colocated sync"] = colocated_sim(
        cfg, steps, w.batch, w.colocated_train_s_per_sample, console
    )

    for name, cfg in configs.items():
        console.rule(name)
        results[name] = _async_row(cfg, one_trainer(cfg, run(cfg, console)), steps)

    console.print(_table(results, w, steps))
    console.print(_where_table(results, w))
    for note in w.notes:
        console.print(note)
    if in_flight:
        console.print("the (d) rows update in flight (async_training.in_flight_update=true)")
    ref = results["colocated sync"]["steady_s"]
    console.print(
        "speedup over colocated sync (steady state): "
        + ", ".join(f"{k.split(' ')[0]} {ref / r['steady_s']:.2f}x" for k, r in results.items())
        + "  (seed, 128 GPUs: stream 1.58x, + staleness + partial 2.35x; at equal tokens,"
        + f" stream {seed_speedup_equal_tokens('(b) stream off-policy'):.2f}x)"
    )
    out = Path(cfg.output_dir) / f"bench-modes-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"workload": w.name, "time_scale": w.time_scale, "steps": steps, "batch": w.batch}
    out.write_text(json.dumps({**record, "notes": w.notes, "results": results}, indent=1))
    console.print(f"figures: {out}")
    return results


def _table(results: dict[str, dict[str, Any]], w: Workload, steps: int) -> Table:
    scale = w.time_scale
    table = Table(
        title=f"modes, {w.name} workload: {steps} steps of {w.batch} samples "
        f"(first one a warm-up, not counted)"
    )
    cols = ["setup", "total s", "s/step"]
    cols += ["seed-s/step", "seed s/step"] if scale else []
    cols += ["trainer idle", "rollouter idle", "stale samples", "partial ratio"]
    cols += ["speedup", "seed speedup", "seed's at equal tokens", "efficiency"]
    for col in cols:
        table.add_column(col, justify="right")
    ref = results["colocated sync"]["steady_s"]
    for name, r in results.items():
        per_step = r["steady_s"] / max(r["steps"], 1)
        seed_x, seed_eq = seed_speedup(name), seed_speedup_equal_tokens(name)
        cells = [name, f"{r['total_s']:.1f}", f"{per_step:.2f}"]
        if scale:
            seed_step = SEED_ROWS.get(name, (None, None))[0]
            cells += [f"{per_step / scale:.1f}", f"{seed_step:.2f}" if seed_step else "-"]
        cells += [
            f"{r['trainer_idle']:.2f}",
            f"{r['rollouter_idle']:.2f}",
            str(r["stale_samples"]),
            f"{r['partial_ratio']:.2f}",
            f"{ref / r['steady_s']:.2f}x",
            f"{seed_x:.2f}x" if seed_x else "-",
            f"{seed_eq:.2f}x" if seed_eq else "-",
            f"{r['ideal_s'] / r['steady_s']:.2f}",
        ]
        table.add_row(*cells)
    return table


def _where_table(results: dict[str, dict[str, Any]], w: Workload) -> Table:
    """Per step, where the trainer's time goes, how busy each side is (its ideal share), and
    how full the rollout engine is: the mean of its batch over a full one, and of the empty
    rest the part with the version's budget spent (what the staleness budget cost)."""
    unit = 1 / w.time_scale if w.time_scale else 1.0
    table = Table(title=f"per step, {'seed seconds' if w.time_scale else 'seconds'}")
    cols = ("setup", "update", "wait for samples", "sync", "of it: pause", "other")
    for col in (*cols, "rollout busy", "trainer busy", "engine full", "empty, out of budget"):
        table.add_column(col, justify="right")
    digits = 1 if w.time_scale else 3
    for name, r in results.items():
        p = r["per_step"]
        if name == "colocated sync":
            cells = [f"{p[k] * unit:.{digits}f}" for k in ("train", "gen")] + ["-"] * 3
        else:
            keys = ("update", "wait for samples", "sync", "sync pause", "other")
            cells = [f"{p[k] * unit:.{digits}f}" for k in keys]
        busy = [f"{r['rollout_util']:.2f}", f"{r['train_util']:.2f}"]
        busy += [_ratio(r.get("occupancy")), _ratio(r.get("budget_unfilled"))]
        table.add_row(name, *cells, *busy)
    return table


def _ratio(value: float | None) -> str:
    """A ratio to two places; '-' where there is none (not measured, or no budget)."""
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench modes``: its description and flags."""
    p.description = (
        "verl's mode table on the sim engine (--workload seed, the seed's 128-GPU figures "
        "time-scaled, or long-tail): colocated sync vs (a) on-policy pipeline, (b) stream "
        "off-policy, (c) stale samples, (d) partial rollout, and a staleness ablation; time, "
        "idle ratios, speedup next to the seed's, efficiency."
    )
    flags.add_staleness(p, "the mode (d) ablation's (default 0.1,0.3, the seed's)")
    p.add_argument(
        "--workload",
        choices=["seed", "long-tail"],
        help="the sim workload; seed (default): the seed's 128-GPU Qwen2.5-7B figures, "
        "time-scaled; long-tail: round numbers (bench/workloads.py)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        help="--workload seed: seconds here per second of the seed (default 0.01)",
    )


def main(args: argparse.Namespace, console: Console) -> None:
    """``asyncrl bench modes``: its flags checked, then the benchmark."""
    if args.time_scale is not None and args.workload == "long-tail":
        raise flags.FlagError(
            "--time-scale applies to --workload seed (long-tail is in seconds already)"
        )
    if args.time_scale is not None and not 0 < args.time_scale < float("inf"):
        raise flags.FlagError(f"--time-scale must be above 0 (got {args.time_scale:g})")
    staleness = flags.staleness(args)
    modes(
        args.config,
        args.overrides,
        console,
        workload=args.workload or "seed",
        time_scale=0.01 if args.time_scale is None else args.time_scale,
        staleness=staleness,
    )
