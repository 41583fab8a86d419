"""How bench learn and bench tuning fold several seeds' runs into one row."""

from asyncrl.bench.learn import median_row


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
