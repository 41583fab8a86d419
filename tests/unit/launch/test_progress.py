"""The live progress line of a run: what it states from a step record's metrics."""

from __future__ import annotations

import io

from rich.console import Console

from asyncrl.config import load_config
from asyncrl.launch.progress import StepProgress
from asyncrl.schemas.step import StepRecord


def test_the_progress_line_shows_the_idle_ratios_and_how_full_the_engine_ran():
    cfg = load_config(None, ["trainer.total_training_steps=10"])
    out = io.StringIO()
    metrics = {
        "critic/score/mean": 0.5,
        "perf/samples_per_s": 12.0,
        "trainer/idle_ratio": 0.16,
        "rollouter/idle_ratio": 0.32,
        "rollouter/engine_occupancy": 0.62,
    }
    rec = StepRecord("r", step=3, version=1, ts=0.0, sample_ids=[], partitions=[], offsets=[])
    rec.metrics = metrics
    with StepProgress(cfg, Console(file=out, width=240)) as progress:
        progress.update(rec)
    text = out.getvalue()
    assert "idle trainer 0.16 rollout 0.32 engine full 0.62" in text
    assert "3/10" in text


def test_reward_failures_show_on_the_progress_line_once_there_are_any():
    """A reward function that raises or times out is counted in the metrics; the terminal
    said nothing of it."""
    cfg = load_config(None, ["trainer.total_training_steps=10"])
    out = io.StringIO()
    with StepProgress(cfg, Console(file=out, width=240)) as progress:
        for step, failures in ((1, 0.0), (2, 3.0), (3, 2.0)):
            rec = StepRecord(
                "r", step=step, version=1, ts=0.0, sample_ids=[], partitions=[], offsets=[]
            )
            rec.metrics = {"critic/score/mean": 0.5, "reward/failures": failures}
            progress.update(rec)
            if step == 1:
                assert progress.reward_failures == 0
    assert progress.reward_failures == 5
    assert "reward failures 5" in out.getvalue()


def test_off_a_terminal_a_run_writes_whole_lines(monkeypatch, tmp_path):
    """``asyncrl run | tee run.log``: rich assumed 80 columns off a terminal and folded each
    evaluation line (time, step, accuracy, reward, samples/s) in two; the run's console, like
    the tables', is PIPED_WIDTH wide there, or COLUMNS when it is set."""
    import os
    import subprocess
    import sys

    import pytest

    from asyncrl.launch import launcher
    from asyncrl.launch.progress import PIPED_WIDTH

    width = "from asyncrl.launch.progress import wide_console; print(wide_console().width)"
    for env, wanted in (({}, PIPED_WIDTH), ({"COLUMNS": "100"}, 100)):
        clean = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        done = subprocess.run(
            [sys.executable, "-c", width], capture_output=True, text=True, env={**clean, **env}
        )
        assert done.stdout.strip() == str(wanted), done.stderr

    made = []

    class Started(Exception):
        pass

    def spy():
        made.append(Console(file=io.StringIO()))
        return made[-1]

    def stop_here():
        raise Started

    monkeypatch.setattr(launcher, "check_startable", lambda cfg, role: None)
    monkeypatch.setattr(launcher, "wide_console", spy)
    monkeypatch.setattr(launcher, "start_role_server", stop_here)
    cfg = load_config(None, [f"output_dir={tmp_path}"])
    with pytest.raises(Started):
        launcher.run(cfg)
    assert len(made) == 1  # the run's own console, when none is given


def test_counts_read_as_words_not_as_a_dict():
    from asyncrl.launch.progress import counts_text

    assert counts_text({}) == "none"
    assert counts_text({"stale": 3, "invalid": 1}) == "stale 3, invalid 1"
