"""``asyncrl replay step N`` with settings that build another model than the checkpoint's:
one line naming the problem, not the 44-line state-dict traceback of torch."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from asyncrl.config import load_config
from asyncrl.ops import replay
from asyncrl.schemas.step import StepRecord


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(overrides=["run_id=r", f"output_dir='{tmp_path}'"])
    before = replay._ckpt(cfg, 4)
    before.mkdir(parents=True)
    torch.save(torch.nn.Linear(3, 3).state_dict(), before / "model.pt")  # the run's model
    record = StepRecord("r", 5, 1, 0.0, [], [], [])
    monkeypatch.setattr(replay, "find_step", lambda *_: record)
    monkeypatch.setattr(replay, "fetch_samples", lambda *_: [])
    import asyncrl.models.warm_start as warm_start

    other = (torch.nn.Linear(2, 2), SimpleNamespace(pad_token_id=0))  # what the settings build
    monkeypatch.setattr(warm_start, "load_policy", lambda _cfg: other)
    with pytest.raises(replay.ReplayError) as err:
        replay.replay_step(cfg, "127.0.0.1:1", 5, Console())
    message = str(err.value)
    assert message.startswith("the checkpoint of step 4 does not load into the model these")
    assert "size mismatch for weight" in message and "\n" not in message


def test_a_step_not_on_the_log_names_the_steps_that_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay step 21` of a 20-step run said only 'step 21 is not on w1.steps'."""
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.step import TAG, encode_step
    from asyncrl.testing import MemoryBroker

    cfg = load_config(overrides=["run_id=r"])
    broker = MemoryBroker()
    monkeypatch.setattr(replay, "read_records", lambda *_: broker.topics.get("r.steps", []))
    with pytest.raises(
        replay.ReplayError, match=r"^step 3 is not on r.steps \(it holds no step yet\)$"
    ):
        replay.find_step(cfg, "-", 3)
    for n in (1, 2):
        rec = encode_step(StepRecord("r", n, 0, 0.0, [], [], []))
        broker.append("r.steps", "r", rec, {SCHEMA_HEADER: TAG.encode()})
    with pytest.raises(
        replay.ReplayError, match=r"^step 21 is not on r.steps \(it holds steps 1-2\)$"
    ):
        replay.find_step(cfg, "-", 21)
