"""bench offpolicy (bench/offpolicy.py): its four variants' configs, and the rows it makes of
their runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import asyncrl.launch.launcher as launcher
import asyncrl.launch.setup as setup
from asyncrl.bench.offpolicy import offpolicy
from asyncrl.config import ConfigError, RunConfig


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


def test_the_uncorrected_variants_row_has_no_correction_or_filter_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without decoupled PPO the trainer logs no mismatch KL and no importance weights, without
    dynamic sampling its summary counts no filtered groups: the table shows '-', not 0. Each
    variant's trainer runs one step broker-free, on the bench's own config, over the same
    groups (the smoke test in tests/integration runs the corrected variant end to end)."""
    import io

    import asyncrl.bench.offpolicy as bench
    from asyncrl.consumers.trainer import Trainer
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.sample import TAG, Sample, Trajectory, encode_sample
    from asyncrl.testing import MemoryBroker, trainer_io
    from tests.helpers import SMALL

    both = "decoupled PPO + dynamic sampling"
    variants = {name: bench.VARIANTS[name] for name in ("no correction", both)}
    monkeypatch.setattr(bench, "VARIANTS", variants)
    monkeypatch.setattr(setup, "prepare_policy", lambda cfg, console: None)

    def run(cfg: RunConfig, console: Console) -> dict[str, Any]:  # the trainer, one step's groups
        broker = MemoryBroker()
        for p in range(cfg.actor_rollout_ref.actor.ppo_mini_batch_size):  # groups with a signal
            trajs = [Trajectory([5, 6, 2], [-0.5, -0.4, -0.3], r) for r in (1.0, 0.0, 0.0, 1.0)]
            sample = Sample(f"g{p}", f"g{p}", 0, [1, 7, 8], "3", trajs)
            broker.publisher().publish(
                cfg.topic("samples"), sample.sample_id, encode_sample(sample), {SCHEMA_HEADER: TAG}
            )
        trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
        try:
            return trainer.run()
        finally:
            trainer.close()

    monkeypatch.setattr(launcher, "run", run)
    results = offpolicy(
        None,
        [
            *SMALL,
            f"actor_rollout_ref.model.cache_dir='{tmp_path / 'models'}'",
            "actor_rollout_ref.model.warmup_steps=1",
            "actor_rollout_ref.rollout.num_workers=0",
            "trainer.total_training_steps=1",
            f"output_dir='{tmp_path}'",
        ],
        Console(file=io.StringIO(), width=240),
    )
    assert list(results) == list(variants)
    assert all(r["steps"] == 1 for r in results.values())
    bare, corrected = results["no correction"], results[both]
    assert bare["mismatch_kl"] is None and bare["is_weight_mean"] is None
    assert bare["filtered_groups"] is None and bare["filtered_share"] is None
    # the same figures from the corrected variant's run: the Nones above could fail
    assert corrected["mismatch_kl"] is not None and corrected["is_weight_mean"] > 0
    assert corrected["filtered_groups"] == 0
