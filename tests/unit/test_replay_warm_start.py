"""``asyncrl replay step N`` (N > 1) loads step N-1's checkpoint over the model it builds: with
an override in the warm start's cache key (``data.*``, which it warns changes nothing) it
warm-started another policy first (minutes, for the countdown task), for the checkpoint to
overwrite. On the demo policy's real shape, no broker: the step's record and samples are
handed in, and the model cache is a tmp dir."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from asyncrl.config import load_config
from asyncrl.consumers.checkpoint import TrainerState, save_checkpoint
from asyncrl.consumers.schedule import set_step_lr
from asyncrl.consumers.update import grpo_update
from asyncrl.models.tiny import build_model, task_tokenizer
from asyncrl.ops import replay
from asyncrl.schemas.step import StepRecord, decode_step, encode_step
from asyncrl.tasks import arithmetic
from tests.unit.test_offpolicy_update import _samples

STEP = 2


def test_a_data_override_replays_a_checkpointed_step_without_a_warm_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = (
        "run_id=r",
        f"output_dir='{tmp_path}'",
        f"actor_rollout_ref.model.cache_dir='{tmp_path / 'cache'}'",
        "actor_rollout_ref.model.warmup_steps=1",  # before the fix: a short warm start
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "async_training.require_batches=2",
        "actor_rollout_ref.model.hidden_size=16",
        "actor_rollout_ref.model.num_hidden_layers=1",
        "actor_rollout_ref.model.num_attention_heads=2",
        "actor_rollout_ref.model.intermediate_size=32",
    )
    cfg = load_config(overrides=list(run))
    # the run's policy after step 1, as the trainer checkpointed it
    vocab = len(task_tokenizer(cfg.data))
    model = build_model(cfg.actor_rollout_ref.model, vocab, seed=7, positions=arithmetic.POSITIONS)
    settings = cfg.actor_rollout_ref.actor.optim
    optim = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    save_checkpoint(cfg.run_dir, model, optim, TrainerState(STEP - 1, 1, {}, {}), keep=10)
    samples = _samples()
    set_step_lr(optim, settings, STEP, cfg.trainer.total_training_steps)
    model.train()
    metrics = grpo_update(model, optim, samples, cfg, torch.device("cpu"))
    save_checkpoint(cfg.run_dir, model, optim, TrainerState(STEP, 2, {}, {}), keep=10)
    ids = [s.sample_id for s in samples]
    record = decode_step(
        encode_step(StepRecord("r", STEP, 1, 0.0, ids, [0] * 4, [0, 1, 2, 3], metrics))
    )
    monkeypatch.setattr(replay, "find_step", lambda *_: record)
    monkeypatch.setattr(replay, "fetch_samples", lambda *_: samples)

    other_data = load_config(overrides=[*run, "data.train_size=500"])  # another cache key
    result = replay.replay_step(other_data, "127.0.0.1:1", STEP, Console(file=io.StringIO()))
    assert result["weights_equal"], result["weights_max_abs_diff"]
    built = sorted(p.name for p in (tmp_path / "cache").glob("*"))
    assert not built, f"a warm start was built for the checkpoint to overwrite: {built}"
