"""The trainer's rank group (consumers/ranks.py, rank_zero.py, rank_follower.py,
rank_checkpoint.py): two gloo ranks on the CPU, real processes, no broker.

Rank 0's backend drives rank 1 through its commands: the steps (rank 0's full copy of the
weights gathered after each), a checkpoint written in the one-process format and loaded back
into both ranks' shards, and the stop. The one-process trainer loads that checkpoint too."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.config import ConfigError, RunConfig
from asyncrl.consumers.checkpoint import TrainerState, write_checkpoint
from asyncrl.consumers.ranks import RankEnv, rank_env
from tests.unit.consumers.test_fsdp_update import _cfg, _policy, _samples


def _two_ranks() -> RunConfig:
    cfg = _cfg()
    cfg.trainer.n_gpus_per_node = 2
    cfg.actor_rollout_ref.nccl_timeout = 60
    return cfg


def _rank(rank: int, port: int, out: str) -> None:
    from asyncrl.consumers.rank_follower import follow_rank_zero
    from asyncrl.consumers.rank_zero import RankZeroUpdate
    from asyncrl.consumers.ranks import RankGroup

    cfg = _two_ranks()
    group = RankGroup(cfg, RankEnv(rank, 2, rank, "127.0.0.1", port))
    try:
        if rank > 0:
            code = follow_rank_zero(cfg, group, policy=_policy(cfg))
            Path(out, "follower.json").write_text(json.dumps(int(code)))
            return
        backend = RankZeroUpdate(cfg, group, policy=_policy(cfg))
        backend.step(_samples(), 1, version=0)
        state = TrainerState(step=1, version=0, batcher={}, metrics={})
        written = write_checkpoint(Path(out), backend.snapshot(state))
        backend.step(_samples(), 2, version=0)
        torch.save(backend.model.state_dict(), f"{out}/two_steps.pt")
        assert backend.load(written).step == 1  # back to step 1, on both ranks
        backend.step(_samples(), 2, version=0)  # step 2 again, from the loaded state
        torch.save(backend.model.state_dict(), f"{out}/two_steps_again.pt")
        backend.stop()
    finally:
        group.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_rank_zero_drives_a_follower_through_steps_a_checkpoint_and_the_stop(tmp_path):
    from asyncrl.consumers.checkpoint import latest_checkpoint
    from asyncrl.consumers.local_update import LocalUpdate

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    assert json.loads((tmp_path / "follower.json").read_text()) == 0  # it took the stop

    cfg = _cfg()
    one = LocalUpdate(cfg, policy=_policy(cfg))
    one.step(_samples(), 1, version=0)
    one.step(_samples(), 2, version=0)
    two_steps = torch.load(tmp_path / "two_steps.pt", weights_only=True)
    # rank 0's copy is the gathered weights: the one-rank steps' to float rounding
    assert _max_diff(two_steps, one.model.state_dict()) < 1e-5
    again = torch.load(tmp_path / "two_steps_again.pt", weights_only=True)
    # the loaded checkpoint (weights and AdamW's moments) gave both ranks step 1's state back
    assert _max_diff(again, two_steps) < 1e-7

    # The one-process trainer resumes from the 2-rank checkpoint and takes the same step 2.
    resumed = LocalUpdate(cfg, policy=_policy(cfg))
    path = latest_checkpoint(tmp_path)
    assert path is not None
    assert resumed.load(path).step == 1
    resumed.step(_samples(), 2, version=0)
    assert _max_diff(resumed.model.state_dict(), two_steps) < 1e-5
    fresh = LocalUpdate(cfg, policy=_policy(cfg))  # AdamW's moments lost: another step 2
    fresh.model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
    fresh.step(_samples(), 2, version=0)
    assert _max_diff(fresh.model.state_dict(), two_steps) > 1e-4


def test_a_rank_count_the_environment_did_not_start_is_refused_naming_the_key():
    cfg = _two_ranks()
    with pytest.raises(ConfigError, match=r"trainer.n_gpus_per_node: .* no RANK, WORLD_SIZE"):
        rank_env(cfg, {})
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=3 ranks .* = 2: `asyncrl run`"):
        rank_env(cfg, env)
    assert rank_env(cfg, {**env, "WORLD_SIZE": "2"}) == RankEnv(1, 2, 1, "h", 1)
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 .* = 1"):
        rank_env(_cfg(), {**env, "WORLD_SIZE": "2"})
    assert rank_env(_cfg(), {}) is None  # one process: today's trainer
