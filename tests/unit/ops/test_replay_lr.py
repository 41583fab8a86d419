"""``asyncrl replay step N`` runs the step at the learning rate it recorded: a run resumed with
another ``trainer.total_training_steps`` (a key a resume may change) ran its earlier steps on
another cosine schedule than its saved config gives, and their replay "differed" with nothing
changed. On the tiny model, no broker: the step's record and samples are handed in."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from asyncrl.config import load_config
from asyncrl.config.load import dump_config
from asyncrl.consumers.checkpoint import TrainerState, save_checkpoint
from asyncrl.consumers.schedule import set_step_lr
from asyncrl.consumers.update import grpo_update
from asyncrl.ops import replay
from asyncrl.schemas.step import StepRecord, decode_step, encode_step
from tests.unit.consumers.test_offpolicy_update import _cfg, _model, _samples

STEP = 5


@pytest.fixture
def resumed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Step 5 trained under total_training_steps=200; the run then resumed (and saved its
    config) with 40. Returns the saved config."""
    run_opts = (
        "run_id=r",
        f"output_dir='{tmp_path}'",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.lr=0.01",
    )
    first = _cfg(*run_opts, "trainer.total_training_steps=200")
    saved = _cfg(*run_opts, "trainer.total_training_steps=40")
    dump_config(saved, saved.run_dir / "config.yaml")
    model = _model(first)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    save_checkpoint(first.run_dir, model, optim, TrainerState(STEP - 1, 1, {}, {}), keep=10)
    start = copy.deepcopy(model)
    samples = _samples()
    set_step_lr(optim, first.actor_rollout_ref.actor.optim, STEP, 200)
    metrics = grpo_update(model, optim, samples, first, torch.device("cpu"))
    save_checkpoint(first.run_dir, model, optim, TrainerState(STEP, 1, {}, {}), keep=10)
    ids = [s.sample_id for s in samples]
    record = StepRecord("r", STEP, 1, 0.0, ids, [0] * 4, list(range(4)), metrics)
    record = decode_step(encode_step(record))  # the metrics as the log holds them
    monkeypatch.setattr(replay, "find_step", lambda *_: record)
    monkeypatch.setattr(replay, "fetch_samples", lambda *_: samples)
    import asyncrl.models.warm_start as warm_start

    policy = (start, SimpleNamespace(pad_token_id=0))
    monkeypatch.setattr(
        warm_start, "load_policy", lambda _cfg, **_: (copy.deepcopy(policy[0]), policy[1])
    )
    return saved


def test_a_step_of_an_earlier_launch_replays_bit_identical(resumed_run) -> None:
    cfg = load_config(resumed_run.run_dir / "config.yaml")
    result = replay.replay_step(cfg, "127.0.0.1:1", STEP, Console(file=io.StringIO()))
    assert result["weights_equal"], result["weights_max_abs_diff"]
    lr = result["metrics"]["actor/lr"]
    assert lr["replayed"] == lr["recorded"]


def test_a_changed_rate_runs_the_replay_s_schedule_and_shows_it(resumed_run) -> None:
    from asyncrl.consumers.schedule import lr_factor

    cfg = load_config(
        resumed_run.run_dir / "config.yaml", ["actor_rollout_ref.actor.optim.lr=0.02"]
    )
    result = replay.replay_step(cfg, "127.0.0.1:1", STEP, Console(file=io.StringIO()))
    assert not result["weights_equal"]
    lr = result["metrics"]["actor/lr"]
    assert lr["replayed"] == 0.02 * lr_factor(cfg.actor_rollout_ref.actor.optim, STEP - 1, 40)
    assert lr["recorded"] == 0.01 * lr_factor(cfg.actor_rollout_ref.actor.optim, STEP - 1, 200)
