"""bench offpolicy's set-up: its four variants' configs (bench/offpolicy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

import asyncrl.launch.launcher as launcher
import asyncrl.launch.setup as setup
from asyncrl.bench.offpolicy import offpolicy
from asyncrl.config import ConfigError


def test_an_override_only_the_corrected_variants_take_fails_before_any_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """rollout_correction overrides go to the corrected variants only, whose configs were
    loaded in turn: a bad rollout_rs failed after the uncorrected variant had run (minutes at
    the bench's 160 steps). Found by a tuning walkthrough: the four configs load first."""
    ran: list[str] = []
    monkeypatch.setattr(setup, "prepare_policy", lambda cfg, console: ran.append("policy"))
    monkeypatch.setattr(launcher, "run", lambda cfg, console: ran.append(cfg.run_id))
    bad = ["algorithm.rollout_correction.rollout_rs=token_k9", f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="rollout_rs='token_k9'"):
        offpolicy(None, bad, Console())
    assert ran == []
