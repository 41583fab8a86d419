"""A trainer of two ranks (FSDP2 over gloo, real processes, a real broker) under ``asyncrl run``:
it trains the demo with the log exact, and the group survives the loss of a rank: killed, or
hung in a collective (found within ``actor_rollout_ref.nccl_timeout``)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from asyncrl.schemas import control as ev
from tests.helpers import check_log_invariants, read_topic, report_recovery
from tests.integration.test_faults import _run_with_fault, _wait_for_step

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TWO_RANKS = [
    "trainer.n_gpus_per_node=2",
    "trainer.device=cpu",
    "actor_rollout_ref.nccl_timeout=60",
]


def _title_of_rank_one(cfg, pids: dict[str, int], out: dict) -> None:
    """What ``ps`` shows of rank 1 once step 2 is on the log."""
    if _wait_for_step(cfg, 2):
        out["cmdline"] = Path(f"/proc/{pids['trainer-rank-1']}/cmdline").read_bytes()


def test_two_ranks_train_the_demo_with_the_log_exact(make_run_cfg, quick_policy):
    steps = 8
    cfg = make_run_cfg(
        *quick_policy,
        *TWO_RANKS,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=4",
        "trainer.save_freq=4",
    )
    summary, seen, out = _run_with_fault(cfg, _title_of_rank_one)
    assert summary["step"] == steps and "restarts" not in summary
    assert re.search(r"trainer pid \d+, trainer-rank-1 pid \d+, rollout-0 pid \d+", out)
    assert b"asyncrl train rank 1/2" in seen["cmdline"]  # ps names the rank

    records = [r.value for r in read_topic(cfg, "steps")]
    assert [s.step for s in records] == list(range(1, steps + 1))  # one record per global step
    used = [sid for s in records for sid in s.sample_ids]
    assert len(used) == len(set(used)) == steps * 8
    info = check_log_invariants(cfg)  # asyncrl audit, unchanged
    assert info["trainer_restarts"] == 0 and info["run_finished"] == 1

    follower = (cfg.run_dir / "logs" / "trainer-rank-1.log").read_text()
    assert "trainer rank 1/2 on " in follower
    assert len(re.findall(r"step \d+, version \d+: its 4 of 8 samples trained", follower)) == steps
    assert "rank 0 has stopped: exiting" in follower
    # rank 0 wrote the checkpoint in the one-process format: AdamW's state keyed by index
    latest = (cfg.run_dir / "checkpoints" / "latest").read_text().strip()
    state = torch.load(cfg.run_dir / "checkpoints" / latest / "optimizer.pt", weights_only=True)
    assert sorted(state["state"]) == list(range(len(state["param_groups"][0]["params"])))


def _stop_rank_one(cfg, pids: dict[str, int], how: signal.Signals, at: int, out: dict) -> None:
    """``how`` to rank 1 once the steps topic shows step ``at``."""
    if _wait_for_step(cfg, at):
        out["pid"] = pids["trainer-rank-1"]
        out["at"] = time.time()
        os.kill(out["pid"], how)


@pytest.mark.parametrize(
    "how",
    # hung: rank 0 fails its next collective at actor_rollout_ref.nccl_timeout (5 s here)
    [signal.SIGKILL, signal.SIGSTOP],
    ids=["killed", "hung"],
)
def test_a_lost_rank_restarts_the_group_from_its_checkpoint(make_run_cfg, quick_policy, how):
    steps = 10
    cfg = make_run_cfg(
        *quick_policy,
        *TWO_RANKS,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=3",
        "trainer.test_freq=0",
        "actor_rollout_ref.nccl_timeout=5",
    )
    summary, fault, out = _run_with_fault(cfg, _stop_rank_one, how, 4, join_s=240)
    assert fault, "rank 1 was never stopped"
    assert summary["step"] == steps and summary["restarts"] == {"trainer": 1}
    assert "restarting it (1/3" in out
    if how == signal.SIGKILL:  # rank 1's death ended the group
        said = f"trainer exited with code -9 (trainer-rank-1, pid {fault['pid']}, killed by SIGKILL"
    else:  # rank 0's collective timed out: rank 0 failed, and rank 1 was killed with it
        said = "trainer exited with code 1; restarting it"
    assert said in out, out
    events = [r.value for r in read_topic(cfg, "control")]
    resumed = [e for e in events if isinstance(e, ev.TrainerResumed)]
    assert len(resumed) == 1 and resumed[0].step == 3
    starts = {e.incarnation for e in events if isinstance(e, ev.WorkerStarted)}
    assert len(starts) == 1  # the worker survived the group's restart
    info = check_log_invariants(cfg)
    assert info["trainer_restarts"] == 1 and info["run_finished"] == 1
    scenario = "trainer rank 1 " + ("SIGKILL" if how == signal.SIGKILL else "SIGSTOP (hung)")
    took = report_recovery(cfg, scenario, fault["at"])
    if how == signal.SIGSTOP:
        assert took >= 5  # not before the collective timed out
