"""Start-up checks of a sharded trainer (launch/preflight_ranks.py): what cannot run is refused
before anything starts, naming the key; one rank adds no check."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.preflight import check_startable
from asyncrl.launch.preflight_ranks import rank_checks


def _failed(*overrides: str, role: str = "run") -> dict[str, str]:
    cfg = load_config(overrides=["trainer.device=cpu", *overrides])
    return {c.key: c.detail for c in rank_checks(cfg, role, here=True) if c.ok is False}


def test_one_rank_adds_no_check():
    assert rank_checks(load_config(overrides=[]), "run", here=True) == []


def test_two_cpu_ranks_that_can_run_pass():
    cfg = load_config(overrides=["trainer.device=cpu", "trainer.n_gpus_per_node=2"])
    (check,) = rank_checks(cfg, "run", here=True)
    assert check.ok and "2 trainer ranks (1 x 2), processes on the CPU (gloo)" in check.detail


@pytest.mark.parametrize(
    ("overrides", "key", "detail"),
    [
        (["trainer.nnodes=2"], "trainer.nnodes", "starts the trainer's ranks on its own machine"),
        (["actor_rollout_ref.rollout.name=sim"], "trainer.n_gpus_per_node", "one trainer"),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=9"],
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            "9 samples do not split evenly over 2 trainer ranks",
        ),
        (
            ["actor_rollout_ref.actor.use_dynamic_bsz=true"],
            "actor_rollout_ref.actor.use_dynamic_bsz",
            "micro-batch counts must agree",
        ),
    ],
)
def test_what_cannot_run_is_refused_naming_the_key(overrides, key, detail):
    failed = _failed("trainer.n_gpus_per_node=2", *overrides)
    assert detail in failed[key]


def test_ranks_on_several_machines_may_be_started_by_hand():
    assert _failed("trainer.nnodes=2", role="train") == {}


def test_ray_places_ranks_on_several_machines():
    assert _failed("trainer.nnodes=2", "launcher=ray") == {}


def test_the_run_stops_at_start_up_naming_the_key(tmp_path):
    cfg = load_config(
        overrides=[
            f"output_dir={tmp_path}",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=3",
        ]
    )
    with pytest.raises(ConfigError, match="actor.ppo_mini_batch_size: 8 samples do not split"):
        check_startable(cfg, "train")


def test_more_ranks_per_machine_than_gpus_is_refused(monkeypatch):
    import torch

    # a fake GPU count: this machine has no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = load_config(overrides=["trainer.device=cuda", "trainer.n_gpus_per_node=2"])
    failed = {c.key: c.detail for c in rank_checks(cfg, "run", here=True) if c.ok is False}
    assert (
        "2 ranks on this machine need a GPU each (NCCL), and it has 1"
        in failed["trainer.n_gpus_per_node"]
    )
