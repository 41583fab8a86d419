"""``asyncrl bench modes``: the structure of verl's 128-GPU mode table (seeds ``001``) on one machine.

Every setup runs the ``sim`` engine's long-tail workload (see ``producers/engines/sim.py``) for
the same number of *steps*, a step being what the seed's table counts: one colocated training
step of ``B`` samples, or one sync window of the async trainer (``trigger x required = B``
samples, in ``trigger`` local updates). Resources follow the seed's "128 colocated vs 64:64":
two units in all. Colocated sync uses both units for each phase in turn: rollout with twice a
replica's capacity, then training at half the per-sample time. The async setups give one unit to
a rollout worker (one replica) and one to the trainer, and run through the whole real system
(broker, control events, budget, staleness, interrupts).

Efficiency is the ideal time over the measured one. Ideal: the modelled work of the samples
that were trained on, each kind over its resources: for the async setups the slower of rollout
(tokens x decode_step_s / capacity) and training (samples x train_s_per_sample); for colocated
sync the two phases add up, since they cannot overlap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench.sync_pause import partial_totals, step_rows
from asyncrl.config import RunConfig, load_config
from asyncrl.telemetry.metrics import stale_in_step

BATCH = 32  # samples per step (the colocated train_batch_size)
TRIGGER = 4  # local updates per sync window in modes (b)-(d)

MODES_DEFAULTS = [
    "actor_rollout_ref.rollout.name=sim",
    "data.max_response_length=256",
    "actor_rollout_ref.rollout.n=4",
    # 32 samples x 4 = 128 sequences may be in flight for a replica of 64: the engine queues
    # the rest, as vLLM does, so the budget, not this limit, decides how full it runs.
    "actor_rollout_ref.rollout.max_concurrent_samples=32",
    "sim.capacity=64",
    "sim.decode_step_s=0.004",
    "sim.train_s_per_sample=0.015",
    "trainer.target_accuracy=null",
    "trainer.test_freq=0",
    "trainer.save_freq=0",
    "output_dir=runs/bench",
]

# name -> (trigger, require_batches, staleness, partial); mini-batch 8, B = 32 per step.
SETUPS: dict[str, tuple[int, int, float, bool]] = {
    "(a) on-policy pipeline": (1, BATCH // 8, 0.0, False),
    "(b) stream off-policy": (TRIGGER, BATCH // (8 * TRIGGER), 0.0, False),
    "(c) stale samples": (TRIGGER, BATCH // (8 * TRIGGER), 0.5, False),
    "(d) partial rollout": (TRIGGER, BATCH // (8 * TRIGGER), 0.5, True),
}
ABLATION = (0.1, 0.3)  # staleness 0 is (b), 0.5 is (d)


def _setup_overrides(trigger: int, require: int, staleness: float, partial: bool) -> list[str]:
    return [
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        f"async_training.require_batches={require}",
        f"async_training.trigger_parameter_sync_step={trigger}",
        f"async_training.staleness_threshold={staleness}",
        f"async_training.partial_rollout={'true' if partial else 'false'}",
    ]


def colocated_sim(cfg: RunConfig, steps: int, batch: int) -> dict[str, Any]:
    """Colocated sync on the same latency model: generate a whole batch (both units: twice
    the capacity), then train on it (both units: half the time per sample); no Kafka."""
    from asyncrl.producers.engines.base import GenRequest
    from asyncrl.producers.engines.sim import SimEngine

    sim = cfg.sim.model_copy(update={"capacity": 2 * cfg.sim.capacity})
    engine = SimEngine(None, sim, vocab_size=30, eos_token_id=2)  # type: ignore[arg-type]
    n, max_len = cfg.actor_rollout_ref.rollout.n, cfg.data.max_response_length
    gen_s = train_s = 0.0
    tokens = 0
    t0 = time.monotonic()
    for k in range(steps):
        t = time.monotonic()
        reqs = [
            GenRequest(f"colocated-{k}-{i}#{j}", [1], max_new_tokens=max_len)
            for i in range(batch)
            for j in range(n)
        ]
        tokens += sum(len(r.response_ids) for r in engine.generate(reqs))
        gen_s += time.monotonic() - t
        t = time.monotonic()
        time.sleep(cfg.sim.train_s_per_sample / 2 * batch)
        train_s += time.monotonic() - t
    total = time.monotonic() - t0
    ideal = (
        tokens * sim.decode_step_s / sim.capacity + steps * batch * cfg.sim.train_s_per_sample / 2
    )
    return {
        "total_s": total,
        "local_updates": steps,
        "trainer_idle": gen_s / total,
        "rollouter_idle": train_s / total,
        "stale_samples": 0,
        "partial_ratio": 0.0,
        "ideal_s": ideal,
    }


def _async_row(cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The row of an async run, from its metrics file."""
    rows = step_rows(cfg)

    def mean(key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else float("nan")

    partial, _span = partial_totals(rows)
    samples = summary["samples_trained"]
    n = cfg.actor_rollout_ref.rollout.n
    tokens = sum(r["response_length/mean"] * n * cfg.required_samples for r in rows)
    rollout_ideal = tokens * cfg.sim.decode_step_s / cfg.sim.capacity
    train_ideal = samples * cfg.sim.train_s_per_sample
    return {
        # from the first worker's join: process start-up is not part of a step's cost
        "total_s": summary["elapsed_s"] - (summary.get("first_worker_joined_s") or 0.0),
        "local_updates": summary["step"],
        "trainer_idle": mean("trainer/idle_ratio"),
        "rollouter_idle": mean("rollouter/idle_ratio"),
        # samples trained at least one version behind (by the oldest token), step by step
        "stale_samples": sum(stale_in_step(r) for r in rows),
        "partial_ratio": partial / max(samples * n, 1),  # of the trajectories
        "ideal_s": max(rollout_ideal, train_ideal),
    }


def modes(
    config: str | None,
    overrides: list[str],
    console: Console,
    steps: int = 20,
    ablation: bool = True,
) -> dict[str, Any]:
    """Colocated sync vs modes (a)-(d), plus the staleness ablation; print and return the table.

    ``trainer.total_training_steps=N`` among the overrides sets ``steps`` (sync windows per
    run; each async run then trains N x its trigger_parameter_sync_step local updates), so a
    smoke run is ``asyncrl bench modes trainer.total_training_steps=2``.
    """
    from asyncrl.launch.launcher import prepare_policy, run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    given = [
        o for o in overrides if o.lstrip("+").partition("=")[0] == "trainer.total_training_steps"
    ]
    if given:
        steps = int(given[-1].partition("=")[2])
        overrides = [o for o in overrides if o not in given]
        console.log(f"{steps} steps (sync windows) per setup, from trainer.total_training_steps")
    base = [*MODES_DEFAULTS, *overrides]
    results: dict[str, dict[str, Any]] = {}

    cfg = load_config(config, [*base, f"run_id=modes-colocated-{stamp}"])
    prepare_policy(cfg, console)  # once, before the async runs start their processes
    console.rule("colocated sync (modelled in one process, both units)")
    results["colocated sync"] = colocated_sim(cfg, steps, BATCH)

    setups = dict(SETUPS)
    if ablation:
        for s in ABLATION:
            setups[f"(d) staleness {s}"] = (TRIGGER, BATCH // (8 * TRIGGER), s, True)
    for name, setup in setups.items():
        trigger = setup[0]
        run_id = "modes-" + name.split(")")[0].strip("(") + f"-{setup[2]}-{stamp}"
        cfg = load_config(
            config,
            [
                *base,
                *_setup_overrides(*setup),
                f"trainer.total_training_steps={steps * trigger}",  # a step: one sync window
                f"run_id={run_id.replace('.', '_')}",
            ],
        )
        assert cfg.samples_per_version == BATCH, (name, cfg.samples_per_version)
        console.rule(name)
        results[name] = _async_row(cfg, run(cfg, console))

    table = _table(results, steps)
    console.print(table)
    ref = results["colocated sync"]["total_s"]
    console.print(
        "speedup over colocated sync: "
        + ", ".join(f"{k.split(' ')[0]} {ref / r['total_s']:.2f}x" for k, r in results.items())
        + "  (seed, 128 GPUs: stream 1.6x, + staleness + partial 2.35x)"
    )
    out = Path(cfg.output_dir) / f"bench-modes-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": steps, "batch": BATCH, "results": results}, indent=1))
    console.print(f"figures: {out}")
    return results


def _table(results: dict[str, dict[str, Any]], steps: int) -> Table:
    table = Table(title=f"modes: {steps} steps of {BATCH} samples, sim long-tail workload")
    cols = (
        "setup",
        "total s",
        "s/step",
        "trainer idle",
        "rollouter idle",
        "stale samples",
        "partial ratio",
        "speedup",
        "efficiency",
    )
    for col in cols:
        table.add_column(col, justify="right")
    ref = results["colocated sync"]["total_s"]
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['total_s']:.1f}",
            f"{r['total_s'] / steps:.2f}",
            f"{r['trainer_idle']:.2f}",
            f"{r['rollouter_idle']:.2f}",
            str(r["stale_samples"]),
            f"{r['partial_ratio']:.2f}",
            f"{ref / r['total_s']:.2f}x",
            f"{r['ideal_s'] / r['total_s']:.2f}",
        )
    return table
