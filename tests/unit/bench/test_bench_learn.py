"""How bench learn and bench tuning fold several seeds' runs into one row."""

import pytest

from asyncrl.bench.learn import (
    COLOCATED,
    async_row,
    best_colocated,
    colocated_name,
    colocated_threads,
    median_row,
)
from asyncrl.bench.sync_pause import one_trainer
from asyncrl.config import load_config


def _run(seed, steps, t, acc=0.9):
    return {
        "seed": seed,
        "steps": steps,
        "target": 0.9,
        "time_to_target_s": t,
        "final_accuracy": acc,
        "curve": [],
    }


def test_medians_are_over_the_runs_that_reached_the_target():
    row = median_row(
        [_run(0, 100, 4.0), _run(1, 150, 9.0), _run(2, 400, None, 0.85), _run(3, 90, 3.0)]
    )
    assert row["reached"] == 3 and row["runs_n"] == 4
    assert row["time_to_target_s"] == 4.0 and row["steps"] == 100
    assert (row["fastest_s"], row["slowest_s"]) == (3.0, 9.0)
    assert row["final_accuracy"] == 0.9  # over every run: 0.85, 0.9, 0.9, 0.9


def test_a_setup_that_never_reached_the_target_has_no_time():
    row = median_row([_run(0, 400, None, 0.8), _run(1, 400, None, 0.7)])
    assert row["reached"] == 0 and row["time_to_target_s"] is None
    assert row["steps"] == 400  # how far they went


def _rows(*points):
    return [{"step": s, "perf/elapsed_s": t, "val/accuracy": a} for s, t, a in points]


def test_an_async_runs_time_counts_from_the_first_workers_join():
    cfg = load_config(None, ["trainer.target_accuracy=0.9"])
    summary = {"step": 10, "first_worker_joined_s": 1.5, "val/accuracy_initial": 0.4}
    rows = _rows((5, 3.0, 0.8), (10, 5.5, 0.92))
    for r, wait, idle in zip(rows, (0.02, 0.04), (0.1, 0.3), strict=True):
        r.update(
            {
                "timing_s/gen": wait,
                "rollouter/idle_ratio": idle,
                "rollouter/budget_idle_ratio": 0.1,
                "rollouter/engine_occupancy": 0.6,
                "rollouter/budget_unfilled_ratio": idle,
            }
        )
    row = async_row(cfg, summary, rows)
    assert row["time_to_target_s"] == 4.0 and row["steps"] == 10
    assert row["curve"][0] == (0.0, 0.4)
    # where an async run's time goes besides the update: the trainer's wait, the worker's idle
    assert row["wait_s"] == pytest.approx(0.03) and row["rollouter_idle"] == pytest.approx(0.2)
    assert row["budget_idle"] == pytest.approx(0.1)
    # how full its engine ran, and the empty share the budget cost
    assert row["engine_full"] == pytest.approx(0.6) and row["budget_unfilled"] == pytest.approx(0.2)
    median = median_row([{"seed": 0, **row}])
    assert median["wait_s"] == pytest.approx(0.03) and median["engine_full"] == pytest.approx(0.6)


def test_a_run_whose_trainer_was_restarted_has_no_time_to_the_target():
    """Its clock restarted at the checkpoint: read as one clock, a run that reached 0.9 at
    step 65 after a 300 s stall measured 0.4 s, a 10.69x "speedup" (bench learn, 2026-11-25)."""
    cfg = load_config(None, ["trainer.target_accuracy=0.9"])
    summary = {
        "step": 65,
        "first_worker_joined_s": 1.2,
        "val/accuracy_initial": 0.39,
        "restarts": {"trainer": 1},
    }
    rows = _rows((55, 6.0, 0.85), (60, 6.6, 0.88), (65, 1.6, 0.9))
    row = async_row(cfg, summary, rows)
    assert row["time_to_target_s"] is None and row["trainer_restarts"] == 1
    assert median_row([{"seed": 0, **row}])["reached"] == 0
    # A worker's restart leaves the trainer's clock running: its time stands.
    summary["restarts"] = {"rollout-0": 1}
    rows = _rows((55, 6.0, 0.85), (65, 7.2, 0.9))
    assert async_row(cfg, summary, rows)["time_to_target_s"] == pytest.approx(6.0)


def test_a_throughput_benchmark_refuses_a_run_whose_trainer_was_restarted():
    cfg = load_config(None, ["run_id=bench-x"])
    assert one_trainer(cfg, {"step": 3}) == {"step": 3}
    with pytest.raises(RuntimeError, match="bench-x: the trainer died and was restarted"):
        one_trainer(cfg, {"step": 3, "restarts": {"trainer": 2}})


def test_the_baseline_is_the_faster_colocated_row(monkeypatch):
    """With a core taken by another process, the colocated loop took 3.6 s with one torch
    thread and 11.6 s with two: the baseline is whichever is faster on the machine at hand,
    the other row stays, named."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert colocated_threads() == [1, 2]
    one, two = median_row([_run(0, 70, 3.6)]), median_row([_run(0, 70, 11.6)])
    results = best_colocated(
        {colocated_name(1): one, colocated_name(2): two, "async (c)": median_row([_run(0, 85, 7)])}
    )
    assert list(results) == [COLOCATED, "colocated sync, 2 threads", "async (c)"]
    assert results[COLOCATED]["threads"] == 1
    assert results[COLOCATED]["time_to_target_s"] == 3.6
    never = median_row([_run(0, 400, None, 0.8)])  # one that got there beats one that did not
    results = best_colocated({colocated_name(1): never, colocated_name(2): two})
    assert results[COLOCATED]["threads"] == 2 and list(results)[1] == "colocated sync, 1 thread"


def test_every_setup_is_checked_before_the_first_one_runs(monkeypatch, tmp_path):
    """A grid cell that cannot run (a tuning grid of staleness 0 in mode (d)) failed only when
    its turn came, after the colocated baseline and the cells before it had run for minutes.
    Found by a tuning walkthrough: every config is loaded first, so it fails before any run."""
    from rich.console import Console

    import asyncrl.bench.learn as learn
    from asyncrl.bench.learn import run_setups
    from asyncrl.config import ConfigError

    ran: list[str] = []
    monkeypatch.setattr(learn, "_colocated", lambda cfg, console, threads: ran.append("colo"))
    monkeypatch.setattr(learn, "_async", lambda cfg, console: ran.append(cfg.run_id))
    setups = {
        COLOCATED: [],
        "fine": ["async_training.staleness_threshold=0.5"],
        "cannot": [
            "async_training.staleness_threshold=0",
            "async_training.partial_rollout=true",
        ],
    }
    with pytest.raises(ConfigError, match="partial_rollout=True needs"):
        run_setups(None, [f"output_dir={tmp_path}"], Console(), setups, 1, "stamp")
    assert ran == []


def test_bench_modes_checks_its_steps_and_every_setup_before_the_baseline(monkeypatch, tmp_path):
    """``bench modes trainer.total_training_steps=abc`` ended in a ValueError traceback, and
    ``--staleness 0`` (the mode (d) ablation, which needs staleness above 0) failed only after
    the colocated baseline ran. Found by a tuning walkthrough: both are config errors that
    name the key, before anything runs."""
    from rich.console import Console

    import asyncrl.bench.modes as modes_mod
    import asyncrl.launch.launcher as launcher
    import asyncrl.launch.setup as setup
    from asyncrl.config import ConfigError

    ran: list[str] = []
    monkeypatch.setattr(setup, "prepare_policy", lambda cfg, console: ran.append("policy"))
    monkeypatch.setattr(modes_mod, "colocated_sim", lambda *a, **k: ran.append("colocated"))
    monkeypatch.setattr(launcher, "run", lambda cfg, console: ran.append(cfg.run_id))
    out = [f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="trainer.total_training_steps"):
        modes_mod.modes(None, [*out, "trainer.total_training_steps=abc"], Console())
    with pytest.raises(ConfigError, match="partial_rollout=True needs"):
        modes_mod.modes(None, [*out, "trainer.total_training_steps=1"], Console(), staleness=(0.0,))
    assert ran == []


def test_an_override_the_benchmark_replaces_is_named(monkeypatch, tmp_path):
    """``bench tuning async_training.trigger_parameter_sync_step=2`` ran the grid's 1, 2 and 4
    and said nothing of the 2; learn's setups replace partial_rollout and in_flight_update,
    modes' each mode's async keys. Found by a tuning walkthrough: each such override is named
    as not applied (a note: shared override lists, as the tests' quick policy, hold them)."""
    import io

    from rich.console import Console

    import asyncrl.bench.tuning as tuning_mod

    monkeypatch.setattr(tuning_mod, "compare", lambda *a, **k: ({}, tmp_path / "x.json"))
    out = io.StringIO()
    given = [
        "async_training.trigger_parameter_sync_step=2",
        "++async_training.staleness_threshold=0.3",
        "async_training.in_flight_update=true",  # not the grid's: applies to every cell
    ]
    tuning_mod.tuning(None, given, Console(file=out, width=300))
    text = out.getvalue()
    assert "bench tuning sets async_training.trigger_parameter_sync_step itself, the grid" in text
    assert "async_training.trigger_parameter_sync_step=2 is not applied" in text
    assert "++async_training.staleness_threshold=0.3 is not applied" in text
    assert "in_flight_update" not in text


def test_bench_learn_names_partial_rollout_alone_as_replaced(monkeypatch):
    """Its "d in flight" row alone sets in_flight_update, so a user's reaches the (c) and (d)
    rows: naming it "not applied" was wrong (found by a tuning walkthrough)."""
    import io

    from rich.console import Console

    import asyncrl.bench.learn as learn_mod

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(learn_mod, "compare", stop)
    out = io.StringIO()
    given = ["async_training.partial_rollout=true", "async_training.in_flight_update=true"]
    with pytest.raises(Stop):
        learn_mod.learn(None, given, Console(file=out, width=300))
    assert "async_training.partial_rollout=true is not applied" in out.getvalue()
    assert "in_flight_update=true is not applied" not in out.getvalue()
