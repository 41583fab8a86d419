"""``asyncrl replay step N`` (N > 1) loads step N-1's checkpoint over the model it builds: with
an override in the warm start's cache key (``data.*``, which it warns changes nothing) it
warm-started another policy first (minutes, for the countdown task), for the checkpoint to
overwrite. Its reference policy (``actor.use_kl_loss``) and step 1's start are the run's own
warm start, not one of the overridden config. On the demo policy's real shape, no broker: the step's record and samples are
handed in, and the model cache is a tmp dir."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from asyncrl.config import RunConfig, load_config
from asyncrl.config.load import dump_config
from asyncrl.consumers.checkpoint import TrainerState, save_checkpoint
from asyncrl.consumers.schedule import set_step_lr
from asyncrl.consumers.update import grpo_update, reference_policy
from asyncrl.models.tiny import build_model, task_tokenizer
from asyncrl.models.warm_start import load_policy
from asyncrl.ops import replay
from asyncrl.schemas.sample import Sample
from asyncrl.schemas.step import StepRecord, decode_step, encode_step
from asyncrl.sync.checksum import weights_checksum
from asyncrl.tasks import arithmetic
from tests.helpers import SMALL_MODEL
from tests.unit.consumers.test_offpolicy_update import _samples

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
        *SMALL_MODEL,
    )
    cfg = load_config(overrides=list(run))
    # the run's policy after step 1, as the trainer checkpointed it
    vocab = len(task_tokenizer(cfg.data))
    model = build_model(cfg.actor_rollout_ref.model, vocab, seed=7, positions=arithmetic.POSITIONS)
    _train_and_record(cfg, model, STEP, monkeypatch)

    other_data = load_config(overrides=[*run, "data.train_size=500"])  # another cache key
    result = replay.replay_step(other_data, "127.0.0.1:1", STEP, Console(file=io.StringIO()))
    assert result["weights_equal"], result["weights_max_abs_diff"]
    built = sorted(p.name for p in (tmp_path / "cache").glob("*"))
    assert not built, f"a warm start was built for the checkpoint to overwrite: {built}"


def _run_with_kl_loss(tmp_path: Path) -> tuple[str, ...]:
    """A tiny demo run whose loss has the KL to its reference, its resolved config saved as
    ``asyncrl run`` saves it (RUN_DIR/config.yaml)."""
    run = (
        "run_id=r",
        f"output_dir='{tmp_path}'",
        f"actor_rollout_ref.model.cache_dir='{tmp_path / 'cache'}'",
        "actor_rollout_ref.model.warmup_steps=1",
        "actor_rollout_ref.model.warmup_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=1.0",
        "async_training.require_batches=2",
        *SMALL_MODEL,
        "data.val_size=4",
    )
    cfg = load_config(overrides=list(run))
    cfg.run_dir.mkdir(parents=True)
    dump_config(cfg, cfg.run_dir / "config.yaml")
    return run


def _recorded(
    samples: list[Sample], metrics: dict[str, float], step: int, checksum: str = ""
) -> StepRecord:
    """The step's record as the trainer writes it on ``steps``."""
    ids = [s.sample_id for s in samples]
    record = StepRecord("r", step, step - 1, 0.0, ids, [0] * 4, [0, 1, 2, 3], metrics)
    record.weights_checksum = checksum
    return decode_step(encode_step(record))


def _train_and_record(
    cfg: RunConfig,
    model: torch.nn.Module,
    step: int,
    monkeypatch: pytest.MonkeyPatch,
    ref: torch.nn.Module | None = None,
    checksum: str = "",
) -> None:
    """Step ``step`` of the run as its trainer takes it: the checkpoint it starts from (none
    for step 1, which starts from the warm start), the update, the checkpoint after it; replay
    is handed the step's record and samples in place of the broker."""
    settings = cfg.actor_rollout_ref.actor.optim
    optim = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    if step > 1:
        state = TrainerState(step - 1, step - 1, {}, {})
        save_checkpoint(cfg.run_dir, model, optim, state, keep=10)
    samples = _samples()
    set_step_lr(optim, settings, step, cfg.trainer.total_training_steps)
    model.train()
    metrics = grpo_update(model, optim, samples, cfg, torch.device("cpu"), ref_model=ref)
    save_checkpoint(cfg.run_dir, model, optim, TrainerState(step, step, {}, {}), keep=10)
    record = _recorded(samples, metrics, step, checksum)
    monkeypatch.setattr(replay, "find_step", lambda *_: record)
    monkeypatch.setattr(replay, "fetch_samples", lambda *_: samples)


def test_a_data_override_replays_with_the_runs_own_reference_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's reference is its first policy, the run's warm start: a replay with a
    ``data.*`` override (in the warm start's cache key) loaded the warm start of its own
    config as the reference, another policy, and the KL loss replayed differed."""
    run = _run_with_kl_loss(tmp_path)
    cfg = load_config(overrides=list(run))
    start, _ = load_policy(cfg)  # the run's warm start, as its trainer loaded it
    ref = reference_policy(cfg, torch.device("cpu"), start=start)
    _train_and_record(cfg, start, STEP, monkeypatch, ref=ref)

    other_data = load_config(overrides=[*run, "data.train_size=500"])  # another warm start
    result = replay.replay_step(other_data, "127.0.0.1:1", STEP, Console(file=io.StringIO()))
    assert result["weights_equal"], result["weights_max_abs_diff"]


def test_a_data_override_replays_step_one_from_the_runs_warm_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1 starts from the run's warm start: with a ``data.*`` override the replay
    warm-started its own config's policy and stopped at the step's recorded checksum."""
    run = _run_with_kl_loss(tmp_path)
    cfg = load_config(overrides=list(run))
    start, _ = load_policy(cfg)
    checksum = weights_checksum(start)
    ref = reference_policy(cfg, torch.device("cpu"), start=start)
    _train_and_record(cfg, start, 1, monkeypatch, ref=ref, checksum=checksum)

    other_data = load_config(overrides=[*run, "data.train_size=500"])
    result = replay.replay_step(other_data, "127.0.0.1:1", 1, Console(file=io.StringIO()))
    assert result["weights_equal"], result["weights_max_abs_diff"]
