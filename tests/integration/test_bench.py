"""Benchmarks run in CI only at smoke size: they must work, their figures are not asserted."""

import io

import pytest
from rich.console import Console

from asyncrl.bench.sync_pause import sync_pause
from tests.helpers import on_session_broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def smoke(broker, tmp_path, quick_policy) -> list[str]:
    """A protocol-test policy on the session broker, writing under the test's tmp_path."""
    return [*quick_policy, *on_session_broker(broker), f"output_dir='{tmp_path}'"]


# Opt-in (`make test-heavy`, ~21 s): a sync's hops from the log are tests/unit/ops/test_sync_hops.py,
# and modes (c), (d) and in-flight syncs run in test_faults.py and test_partial_rollout.py.
@pytest.mark.heavy
def test_sync_pause_smoke(smoke):
    out = io.StringIO()
    result = sync_pause(
        None,
        [
            *smoke,
            "trainer.total_training_steps=3",
        ],
        Console(file=out, width=160),
    )
    assert set(result) == {"c", "d", "d in flight", "pause_ratio_c_over_d", "hops"}
    assert result["c"]["syncs"] == result["d"]["syncs"] == result["d in flight"]["syncs"] == 2
    assert result["c"]["partial_trajectories"] == 0  # mode (c) never interrupts
    assert "mean sync pause" in out.getvalue()
    # Each sync split hop by hop from the log: a paused one through RolloutPaused, an
    # in-flight one without it; the phases add up to at most the whole.
    hops = result["hops"]
    assert {"request_to_paused", "paused_to_send", "published_to_loaded"} <= set(hops["c"])
    assert "request_to_published" in hops["d in flight"]
    assert "request_to_paused" not in hops["d in flight"]
    for h in hops.values():
        assert 0 < h["transfer"] < h["total"]
    assert "where a sync's time goes" in out.getvalue()


def test_modes_smoke(tmp_path, smoke):
    from asyncrl.bench.modes import modes

    out = io.StringIO()
    results = modes(
        None,
        [
            *smoke,
            "trainer.total_training_steps=2",  # a user's smoke size (was replaced by 20)
        ],
        Console(file=out, width=200),
        ablation=False,
        workload="long-tail",
        # Three of the four async runs (each ~5 s), those whose rows are asserted below; that
        # the workload has all four, each in its mode, is in tests/unit/bench/test_bench_modes.py.
        only=("(a)", "(b)", "(d)"),
    )
    assert list(results) == [
        "colocated sync",
        "(a) on-policy pipeline",
        "(b) stream off-policy",
        "(d) partial rollout",
    ]
    assert results["(a) on-policy pipeline"]["local_updates"] == 2
    assert results["(d) partial rollout"]["local_updates"] == 8  # 2 sync windows of 4 updates
    assert all(r["ideal_s"] > 0 and r["total_s"] > 0 for r in results.values())
    assert results["(b) stream off-policy"]["stale_samples"] == 0  # staleness 0: none
    assert "speedup over colocated sync" in out.getvalue()
    assert list(tmp_path.glob("bench-modes-*.json"))


# Opt-in (`make test-heavy`, ~13 s): the seed-shaped workload's model is tests/unit/bench/
# test_seed_workload.py, and `bench modes` runs whole in test_modes_smoke above.
@pytest.mark.heavy
def test_modes_seed_workload_smoke(smoke):
    """The seed-shaped workload at a tiny time scale: colocated sync, mode (d) and the
    ablation at a staleness given (``--staleness``), 3 steps; each row says how full its
    engine ran."""
    from asyncrl.bench.modes import modes

    out = io.StringIO()
    results = modes(
        None,
        [
            *smoke,
            "trainer.total_training_steps=3",
        ],
        Console(file=out, width=220),
        workload="seed",
        time_scale=0.002,
        only=("(d) partial", "(d) staleness"),
        staleness=(0.75,),
    )
    assert list(results) == ["colocated sync", "(d) partial rollout", "(d) staleness 0.75"]
    d = results["(d) partial rollout"]
    assert d["local_updates"] == 12 and d["steps"] == 2  # 3 windows of 4 updates, 1 warm-up
    assert all(r["ideal_s"] > 0 and r["steady_s"] > 0 for r in results.values())
    for r in results.values():
        assert 0 < r["occupancy"] <= 1
    assert 0 <= d["budget_unfilled"] <= 1 - d["occupancy"] + 0.01
    text = out.getvalue()
    assert "2.35x" in text  # the seed's speedup of mode (d), beside ours
    assert "seed-shaped" in text and "150.72" in text  # how the model was derived


# Opt-in (`make test-heavy`, ~15 s): a sample's Arrow encoding round-trips in tests/unit/schemas/,
# and samples travel Arrow over Kafka in every run of make test (the Ray queue row aside).
@pytest.mark.heavy
def test_transport_smoke(broker, tmp_path):
    from asyncrl.bench.transport import VARIANTS, transport

    out = io.StringIO()
    results = transport(
        None,
        [*on_session_broker(broker), f"output_dir='{tmp_path}'"],
        Console(file=out, width=200),
        sizes=(1024,),
        samples={1024: 3},
    )
    row = results["1024"]
    assert list(row) == ["samples", "bytes_per_sample", *VARIANTS]  # ray is a dev dependency
    arrow = row["arrow + kafka"]
    # 16 x 1024 tokens of id (4 B), logprob (4 B), mask (1 B) plus the schema and offsets
    assert 9.0 < arrow["bytes_per_token"] < 11.0
    assert arrow["encode_us"] > 0 and arrow["decode_us"] > 0
    assert all(row[v]["samples_per_s"] > 0 for v in VARIANTS)
    assert "arrow+kafka / raw kafka" in out.getvalue()
    assert list(tmp_path.glob("bench-transport-*.json"))


# Opt-in (`make test-heavy`, ~12 s): tracing's spans are test_tracing.py's runs.
@pytest.mark.heavy
def test_tracing_cost_smoke(smoke):
    from asyncrl.bench.tracing import tracing_cost

    out = io.StringIO()
    result = tracing_cost(
        None,
        [
            *smoke,
            "trainer.total_training_steps=2",
        ],
        Console(file=out, width=160),
    )
    assert result["off"]["spans"] == 0  # off: no span exported anywhere
    assert result["on"]["spans"] > 2 * 8  # a sample's tree is several spans, 2 steps of 8
    assert result["ratio_on_over_off"] > 0
    assert "on/off" in out.getvalue()


def test_learn_smoke(tmp_path, smoke, monkeypatch):
    from asyncrl.bench import learn as bench

    # One async setup of three (each a whole run, ~10 s): the comparison is the same code for
    # each; the modes themselves are tested by test_run, test_partial_rollout and the others.
    monkeypatch.setattr(bench, "ASYNC_SETUPS", {"d in flight": bench.ASYNC_SETUPS["d in flight"]})
    out = io.StringIO()
    results = bench.learn(
        None,
        [
            *smoke,
            "trainer.total_training_steps=2",
            "trainer.test_freq=1",
        ],
        Console(file=out, width=160),
    )
    asyncs = ["async (d in flight)"]
    assert list(results) == ["colocated sync", *_slower_colocated(results), *asyncs]
    assert all(r["steps"] == 2 and r["runs"][0]["curve"] for r in results.values())
    waits = [r["runs"][0].get("wait_s") for name, r in results.items() if name in asyncs]
    assert all(w is not None and w >= 0 for w in waits)
    assert "wait s/step" in out.getvalue()
    png = next(tmp_path.glob("bench-learn-*.png"))
    assert png.read_bytes()[:4] == b"\x89PNG"


# Opt-in (`make test-heavy`, ~12 s): how seeds fold into a cell's row and the grid's checks
# before any run are tests/unit/bench/test_bench_learn.py; `bench learn` runs whole in
# test_learn_smoke.
@pytest.mark.heavy
def test_tuning_runs_each_cell_of_the_grid_once_per_seed(tmp_path, smoke):
    from asyncrl.bench.tuning import tuning

    out = io.StringIO()
    results = tuning(
        None,
        [
            *smoke,
            "trainer.total_training_steps=2",
            "trainer.test_freq=1",
        ],
        Console(file=out, width=200),
        seeds=2,
        staleness=(1.0,),
        trigger=(2,),
    )
    assert list(results) == [
        "colocated sync",
        *_slower_colocated(results),
        "staleness=1 trigger=2",
    ]
    cell = results["staleness=1 trigger=2"]
    assert [r["seed"] for r in cell["runs"]] == [0, 1]
    assert cell["runs_n"] == 2 and all(r["steps"] == 2 for r in cell["runs"])
    configs = sorted(tmp_path.glob("learn-staleness1-trigger2-*/config.yaml"))
    assert len(configs) == 2
    assert "trigger_parameter_sync_step: 2" in configs[0].read_text()
    assert "staleness_threshold: 1.0" in configs[0].read_text()
    assert "medians of 2 seeds" in out.getvalue()


def test_tools_bench_measures_both_sandboxes(tmp_path):
    from asyncrl.bench.tools import tools

    out = io.StringIO()
    results = tools(
        "calculator",
        [
            f"output_dir='{tmp_path}'",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.max_concurrent_samples=2",
        ],
        Console(file=out, width=160),
    )
    assert set(results) == {"sandbox server (fork)", "fresh interpreter"}
    assert all(r["burst_calls"] == 8 and r["one_call_ms"] > 0 for r in results.values())
    assert "fresh / fork" in out.getvalue()
    assert next(tmp_path.glob("bench-tools-*.json")).read_text()


def test_offpolicy_smoke(broker, tmp_path, demo_policy, monkeypatch):
    from asyncrl.bench import offpolicy as bench

    # One of the four variants (each a whole run, ~6 s after the demo's warm start, which the
    # first pays): the one with both corrections; the other two corrected ones are each half
    # of its overrides, and the uncorrected one's row (no KL, no weights, no filtered groups)
    # is shown broker-free in tests/unit/bench/test_bench_offpolicy.py.
    both = "decoupled PPO + dynamic sampling"
    variants = {both: bench.VARIANTS[both]}
    monkeypatch.setattr(bench, "VARIANTS", variants)
    out = io.StringIO()
    results = bench.offpolicy(
        None,
        [
            # The demo's warm start: most groups have a signal. (The quick one's rewards are
            # nearly all 0, so dynamic sampling filters nearly every group.)
            *demo_policy,
            *on_session_broker(broker),
            f"output_dir='{tmp_path}'",
            "trainer.total_training_steps=2",
            "trainer.test_freq=1",
        ],
        Console(file=out, width=240),
    )
    assert list(results) == list(variants)
    assert all(r["steps"] == 2 and r["curve_step"] for r in results.values())
    assert results[both]["is_weight_mean"] > 0
    assert results[both]["filtered_groups"] is not None
    assert "off-policy stress ablation" in out.getvalue()
    assert len(list(tmp_path.glob("bench-offpolicy-*.png"))) == 2


def _slower_colocated(results: dict) -> list[str]:
    """The colocated rows after the baseline: those of the other torch thread counts."""
    from asyncrl.bench.learn import colocated_name, colocated_threads

    best = results["colocated sync"]["threads"]
    return [colocated_name(n) for n in colocated_threads() if n != best]
