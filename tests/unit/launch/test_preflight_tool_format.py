"""Multi-turn on a task whose tokenizer cannot end a tool call fails the start-up checks,
naming multi_turn.format: the dry run said ``ok``, and the real run's roles each died at
start-up with "no single token for ']'", were restarted three times, and the run exited 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.launcher import run
from asyncrl.launch.preflight import dry_run, startup_checks

KEY = "actor_rollout_ref.rollout.multi_turn.format"


def _format_check(*overrides: str):
    cfg = load_config(overrides=list(overrides))
    return next((c for c in startup_checks(cfg, "run") if c.key == KEY), None)


def test_the_arithmetic_tasks_tokenizer_cannot_end_a_compact_tool_call(tmp_path: Path):
    check = _format_check("actor_rollout_ref.rollout.multi_turn.enable=true")
    assert check is not None and check.ok is False
    assert "']'" in check.detail and "data.task=calculator" in check.detail
    overrides = [
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"output_dir={tmp_path}",
        "run_id=mt",
    ]
    assert dry_run(None, overrides) == 2
    with pytest.raises(ConfigError, match=KEY.replace(".", r"\.")):
        run(load_config(overrides=overrides))
    assert not (tmp_path / "mt").exists()  # nothing was started


def test_the_calculator_task_passes_and_single_turn_is_not_checked():
    cfg = load_config("calculator")
    passed = next(c for c in startup_checks(cfg, "run") if c.key == KEY)
    assert passed.ok is True
    assert _format_check() is None  # multi_turn.enable=false: nothing to check


def test_hermes_with_a_tokenizer_that_cannot_spell_it_fails():
    """format=hermes on the calculator demo: the dry run said 'ok: the tokenizer ends a tool
    call', and the run trained for nothing, its character model unable to write '<' or '{'
    (every call read back as <unk>), so tool use stayed at 0."""
    cfg = load_config("calculator", ["actor_rollout_ref.rollout.multi_turn.format=hermes"])
    check = next(c for c in startup_checks(cfg, "run") if c.key == KEY)
    assert check.ok is False
    assert "cannot write a tool call" in check.detail and "format=compact" in check.detail
