"""``asyncrl report`` on a scripted metrics file: the figures it states, the files it writes."""

import json

import pytest

from asyncrl.cli import main
from asyncrl.ops.report import ReportError, resolve_run_dir, sync_windows, write_report


def _run_dir(tmp_path):
    run = tmp_path / "runs" / "scripted"
    run.mkdir(parents=True)
    rows = [
        {"step": 1, "version": 0, "critic/score/mean": 0.2, "perf/elapsed_s": 1.0,
         "perf/samples_per_s": 8.0, "fully_async/staleness/count_0": 8.0,
         "trainer/idle_ratio": 0.5, "rollouter/idle_ratio": 0.25,
         "rollouter/budget_idle_ratio": 0.2, "rollouter/engine_occupancy": 0.7,
         "rollouter/budget_unfilled_ratio": 0.25},
        {"sync": {"version": 1, "pause_s": 0.1, "transfer_s": 0.02, "load_s": 0.05,
                  "resumed_s": 0.2}},
        {"step": 2, "version": 1, "critic/score/mean": 0.5, "perf/elapsed_s": 2.0,
         "perf/samples_per_s": 8.0, "fully_async/staleness/count_0": 5.0,
         "fully_async/staleness/count_1": 3.0, "val/accuracy": 0.6,
         "trainer/idle_ratio": 0.4, "rollouter/idle_ratio": 0.1},
        {"summary": {"reason": "total_training_steps reached", "val/accuracy_initial": 0.4,
                     "val/accuracy": 0.6, "dropped": {}}},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_report_states_the_scripted_figures(tmp_path):
    run = _run_dir(tmp_path)
    (window,) = sync_windows(*_load(run))
    # The sync that made version 1 closed the window whose last step is step 1.
    assert window["trainer_idle"] == 0.5 and window["rollouter_idle"] == 0.25
    assert window["rollouter_budget_idle"] == 0.2
    md = write_report(run).read_text()
    assert "| samples trained | 16 |" in md
    # not samples trained over the wall time: the trainer's rate from the first worker's join
    assert "| samples/s (from the first worker's weights on) | 8.00 |" in md
    assert "| of them stale | 3 (19%) |" in md
    assert "| held-out accuracy, start -> end | 0.400 -> 0.600 |" in md
    assert "| sync pause / transfer, mean (trainer) | 100 / 20 ms |" in md
    assert "| SyncRequested -> resumed, mean | 200 ms |" in md
    assert "| of it out of budget, mean of windows | 0.20 |" in md
    assert "| engine occupancy, mean of windows | 0.70 |" in md
    assert "| engine left empty out of budget, mean | 0.25 |" in md
    assert "| dropped | none |" in md  # was the raw dict: "dropped {}"
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert pngs == [
        "idle_ratios.png",
        "reward_accuracy_step.png",
        "reward_accuracy_time.png",
        "staleness.png",
        "sync_time.png",
        "throughput.png",
    ]
    for name in pngs:
        data = (run / "report" / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 5_000
        assert f"]({name})" in md


def _load(run):
    from asyncrl.ops.report import load_rows

    rows, syncs, _ = load_rows(run)
    return rows, syncs


def test_report_cli_by_run_id_and_a_clear_error(tmp_path, capsys):
    _run_dir(tmp_path)
    assert main(["report", "scripted", "--output-dir", str(tmp_path / "runs")]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", "nope", "--output-dir", str(tmp_path / "runs")]) == 1
    assert "no run at 'nope'" in capsys.readouterr().err
    with pytest.raises(ReportError):
        resolve_run_dir(str(tmp_path))


def test_an_agent_run_gets_a_tool_use_plot(tmp_path):
    run = _run_dir(tmp_path)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "step" in r:
            r.update({"agent/tool_use_rate": 0.25 * r["step"], "agent/tool_errors/mean": 0.0})
        if "summary" in r:
            r["summary"]["val/tool_use_initial"] = 0.3
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(run).read_text()
    assert "](tool_use.png)" in md
    assert (run / "report" / "tool_use.png").read_bytes()[:4] == b"\x89PNG"


def test_report_states_the_off_policy_figures_of_a_run_that_has_them(tmp_path):
    run = _run_dir(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    extra = [
        {"rollout_corr/kl": 0.02, "rollout_corr/k3_kl": 0.001, "rollout_corr/rollout_is_mean": 1.0,
         "rollout_corr/rollout_is_max": 3.5, "rollout_corr/rollout_is_ratio_fraction_high": 0.1,
         "rollout_corr/rollout_rs_masked_fraction": 0.05, "filter_groups/filtered_groups": 2.0,
         "filter_groups/filtered_ratio": 0.2, "fully_async/stale_tokens/masked_ratio": 0.5},
        {"rollout_corr/kl": 0.04, "rollout_corr/k3_kl": 0.003, "rollout_corr/rollout_is_mean": 0.9,
         "rollout_corr/rollout_is_max": 2.0, "rollout_corr/rollout_is_ratio_fraction_high": 0.3,
         "rollout_corr/rollout_rs_masked_fraction": 0.15, "filter_groups/filtered_groups": 4.0,
         "filter_groups/filtered_ratio": 0.4, "fully_async/stale_tokens/masked_ratio": 0.25},
    ]  # fmt: skip
    steps = [json.loads(line) for line in lines]
    steps[0].update(extra[0])
    steps[2].update(extra[1])
    steps[3]["summary"]["filtered"] = 6
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    md = write_report(run).read_text()
    assert "| rollout vs trainer log-probs: KL k1 / k3, mean | 0.0300 / 0.0020 |" in md
    assert "| importance weight: mean / max / share truncated | 0.950 / 3.5 / 20.0% |" in md
    assert "| tokens rejected (rollout_rs), mean share | 10.0% |" in md
    assert "| tokens masked as stale, mean share | 37.5% |" in md
    assert "| groups filtered (dynamic sampling) | 6 (30% of those read) |" in md
    assert (run / "report" / "offpolicy.png").read_bytes()[:4] == b"\x89PNG"
    # a run without them: no such line, no such plot
    plain = write_report(_run_dir(tmp_path / "plain")).read_text()
    assert "importance weight" not in plain and "offpolicy.png" not in plain


def test_a_run_resumed_after_a_kill_reads_as_one_run(tmp_path):
    """Each launch's trainer counts time and samples/s from its own start and redoes the
    steps after its last checkpoint: the report joins the launches, the redone steps once."""
    run = tmp_path / "runs" / "resumed"
    run.mkdir(parents=True)

    def step(n: int, t: float, rate: float, version: int) -> dict:
        return {"step": n, "version": version, "critic/score/mean": 0.5, "perf/elapsed_s": t,
                "perf/samples_per_s": rate, "fully_async/staleness/count_0": 8.0,
                "trainer/idle_ratio": 0.5, "rollouter/idle_ratio": 0.25}  # fmt: skip

    sync = {"version": 1, "pause_s": 0.1, "transfer_s": 0.02, "load_s": 0.05, "resumed_s": 0.2}
    rows = [
        step(1, 1.0, 8.0, 0), {"sync": sync}, step(2, 2.0, 8.0, 1), step(3, 3.0, 8.0, 1),
        # killed after step 3; the checkpoint was step 2: step 3 again, under version 2
        step(3, 0.5, 16.0, 2), {"sync": {**sync, "version": 3}}, step(4, 1.0, 16.0, 3),
        {"sync": {**sync, "version": 5}},  # no step at version 4 (a restart's gap): no ratios
        {"summary": {"reason": "total_training_steps reached", "syncs": 1, "dropped": {}}},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    joined, _ = _load(run)
    assert [r["step"] for r in joined] == [1, 2, 3, 4]
    assert [r["launch"] for r in joined] == [1, 1, 2, 2]
    assert [r["perf/elapsed_s"] for r in joined] == [1.0, 2.0, 3.5, 4.0]
    # 24 samples in the first launch's 3 s, 16 in the second's 1 s
    assert joined[-1]["perf/samples_per_s"] == pytest.approx(40 / 4.0)
    md = write_report(run).read_text()
    # a trainer restart within one `asyncrl run` reads alike: it said "launches 2" of one launch
    assert "| trainer starts (restarts and resumed launches) | 2 |" in md
    assert "| wall time | 4.0 s |" in md and "| samples trained | 32 |" in md
    assert "| samples/s (over the wall time, start-ups included) | 10.00 |" in md
    assert "| syncs | 3 |" in md  # the summary's 1 is the last launch's alone
    assert "| trainer idle ratio, mean of windows | 0.50 |" in md  # the gap's NaN left out


def test_a_run_without_its_summary_still_states_its_start_accuracy(tmp_path):
    """A run killed (or still going) has no summary row: the start accuracy read '-', and
    'still running' was said of a run that had been killed."""
    run = _run_dir(tmp_path)
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()[:-1]]
    rows[0]["val/accuracy_initial"] = 0.4  # the first step row carries it (no summary row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(run).read_text()
    assert "| held-out accuracy, start -> end | 0.400 -> 0.600 |" in md
    assert "| finished because | (not finished: still running, or stopped) |" in md


def test_per_step_samples_per_s_counts_the_samples_trained(tmp_path):
    """The trainer's ``perf/samples_per_s`` runs from when the first worker joined (here 1 s
    after the trainer started), ``perf/elapsed_s`` from the trainer's start: the report took
    their product for the samples trained so far and drew 145 and 135 samples/s for steps
    that trained 8 samples in 0.1 s each (80/s)."""
    from asyncrl.ops.report import _step_rates, join_launches

    rows = [
        {"step": n, "version": 0, "perf/elapsed_s": t, "perf/samples_per_s": 8.0 * n / (t - 1),
         "perf/samples_trained": 8.0 * n}
        for n, t in ((1, 2.0), (2, 2.1), (3, 2.2))
    ]  # fmt: skip
    joined = join_launches(rows)
    assert [rate for _, rate in _step_rates(joined)] == pytest.approx([4.0, 80.0, 80.0])
    assert joined[-1]["perf/samples_per_s"] == pytest.approx(20.0)  # the trainer's own
    # killed after step 3 and resumed: the second launch counts from 0 again
    second = {"step": 4, "version": 0, "perf/elapsed_s": 2.0, "perf/samples_per_s": 8.0,
              "perf/samples_trained": 8.0}  # fmt: skip
    joined = join_launches([*rows, second])
    assert joined[-1]["perf/samples_trained"] == 32.0
    assert joined[-1]["perf/samples_per_s"] == pytest.approx(32.0 / 4.2)


def test_the_trainer_logs_the_samples_it_trained(monkeypatch):
    """The count the report reads, beside the rate it came from."""
    from asyncrl.consumers import step_stats
    from asyncrl.consumers.step_stats import StepStats

    monkeypatch.setattr(step_stats, "step_metrics", lambda samples, **_: {})
    from types import SimpleNamespace

    clock = iter([100.0, 103.0, 105.0])  # the trainer starts, then two steps end
    monkeypatch.setattr(step_stats, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    stats = StepStats({}, n_devices=1)
    kw = {"step": 1, "version": 0, "timing_raw": {}, "dropped": 0, "duplicates": 0, "queued": 0}
    first = stats.of_step([object()] * 8, first_join=101.0, **kw)
    assert first["perf/samples_trained"] == 8.0
    assert first["perf/samples_per_s"] == pytest.approx(8 / 2.0)
    assert first["perf/elapsed_s"] == pytest.approx(3.0)
    second = stats.of_step([object()] * 8, first_join=101.0, **{**kw, "step": 2})
    assert second["perf/samples_trained"] == 16.0


def test_report_takes_output_dir_as_an_override_as_audit_does(tmp_path, capsys, monkeypatch):
    """`asyncrl report RUN output_dir=DIR` was a usage error; audit, inspect and replay take it,
    and report now reads it as they do: `output_dir=~/runs` (its own parser took it as
    written, a directory named ~), and ~output_dir (the default, runs)."""
    _run_dir(tmp_path)
    assert main(["report", "scripted", f"output_dir={tmp_path / 'runs'}"]) == 0
    assert "report.md" in capsys.readouterr().out
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # RUN names no directory here
    assert main(["report", "scripted", "output_dir=~/runs"]) == 0, capsys.readouterr().err
    assert "report.md" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main(["report", "scripted", "~output_dir"]) == 0  # the default, runs
    capsys.readouterr()
    assert main(["report", "scripted", "trainer.total_training_steps=5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("asyncrl report: trainer.total_training_steps: report takes only")
    assert err.count("\n") == 1


def test_output_dir_given_as_an_option_expands_home_as_output_dir_does(
    tmp_path, capsys, monkeypatch
):
    """``--output-dir=~/runs`` (the shell expands no ``~`` after ``=``) looked in a directory
    named ``~`` under the current one, where ``output_dir=~/runs`` finds the run: both go
    through ``cli.find_run.output_dir_of``, which expanded only the override's."""
    _run_dir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["report", "scripted", "--output-dir=~/runs"]) == 0, capsys.readouterr().err
    assert "report.md" in capsys.readouterr().out
