"""The start-up warning of workers a version's budget never reaches (launch/preflight.py)."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.launch.preflight import dry_run, idle_workers_note


def test_workers_past_a_versions_budget_are_warned_of(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/tuning.md's remedy for a busy rollout is more workers; a version's samples are
    shared among them, so with 16 workers and 8 samples a version (trigger 1, staleness 0, 8 a
    step) 8 workers idled every version and nothing said so. Found by a tuning walkthrough:
    the launcher and --dry-run warn."""
    small = [
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=0",
        f"output_dir={tmp_path}",
    ]
    cfg = load_config(overrides=[*small, "actor_rollout_ref.rollout.num_workers=16"])
    note = idle_workers_note(cfg)
    assert note is not None and note.startswith("rollout.num_workers=16, but a version admits")
    assert "at most 8 samples" in note and "8 worker(s) never get one" in note
    # 8 workers share 8 samples; staleness 0.5 makes it 12, enough for 12
    assert (
        idle_workers_note(
            load_config(overrides=[*small, "actor_rollout_ref.rollout.num_workers=8"])
        )
        is None
    )
    stale = [*small[:1], "async_training.staleness_threshold=0.5", small[2]]
    assert (
        idle_workers_note(
            load_config(overrides=[*stale, "actor_rollout_ref.rollout.num_workers=12"])
        )
        is None
    )
    assert dry_run(None, [*small, "actor_rollout_ref.rollout.num_workers=16"]) == 0
    out = capsys.readouterr().out
    assert f"# warning: {note}\n# dry run: nothing started" in out
