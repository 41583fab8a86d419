"""The trainer's ranks as one launcher process (launch/rank_group.py), on real processes
(``sleep`` and ``sh`` stand in for the ranks: what is tested is how the group ends)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from asyncrl.launch.rank_group import TrainerGroup, rank_log, ranks_starter


def _proc(script: str) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", script])


def _until(group: TrainerGroup, timeout: float = 20.0) -> int | None:
    deadline = time.monotonic() + timeout
    while (rc := group.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return rc


def test_a_rank_that_dies_ends_the_group_with_its_code_and_rank_zero_is_killed(tmp_path):
    ranks = [
        ("trainer", _proc("sleep 60"), tmp_path / "trainer.log"),
        ("trainer-rank-1", _proc("sleep 60"), tmp_path / "trainer-rank-1.log"),
    ]
    group = TrainerGroup(ranks)
    assert group.poll() is None
    os.kill(ranks[1][1].pid, signal.SIGKILL)
    assert _until(group) == -signal.SIGKILL
    assert ranks[0][1].poll() == -signal.SIGKILL  # killed, reaped: its lock is free
    assert group.exit_note is not None
    assert group.exit_note.startswith(f"trainer-rank-1, pid {ranks[1][1].pid}, killed by SIGKILL")


def test_the_group_ends_with_rank_zero_and_a_rank_left_behind_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr("asyncrl.launch.rank_group.STOP_GRACE_S", 0.5)
    ranks = [
        ("trainer", _proc("exit 0"), tmp_path / "trainer.log"),
        ("trainer-rank-1", _proc("sleep 60"), tmp_path / "trainer-rank-1.log"),
    ]
    group = TrainerGroup(ranks)
    assert _until(group) == 0 and group.exit_note is None
    assert ranks[1][1].poll() == -signal.SIGKILL


def test_a_signal_death_is_the_cause_not_a_rank_that_failed_after_it(tmp_path):
    ranks = [
        ("trainer", _proc("exit 1"), tmp_path / "trainer.log"),
        ("trainer-rank-1", _proc("kill -9 $$"), tmp_path / "trainer-rank-1.log"),
    ]
    for _, proc, _ in ranks:
        proc.wait()
    group = TrainerGroup(ranks)
    assert group.poll() == -signal.SIGKILL and "trainer-rank-1" in (group.exit_note or "")


def test_the_ranks_are_started_with_torchruns_variables_and_logs_of_their_own(tmp_path):
    started: list[tuple[str, Path, dict[str, str]]] = []

    def start(name, cmd, log_path, env=None):
        started.append((name, log_path, env))
        return _proc("exit 0"), log_path

    group, path = ranks_starter(start, 2)("trainer", ["asyncrl", "train"], tmp_path / "trainer.log")
    assert path == tmp_path / "trainer.log"
    assert [(n, p.name) for n, p, _ in started] == [
        ("trainer", "trainer.log"),
        ("trainer-rank-1", "trainer-rank-1.log"),
    ]
    envs = [env for _, _, env in started]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert _until(group) == 0
    # a worker is started as before, alone
    ranks_starter(start, 2)("rollout-0", ["asyncrl", "rollout"], tmp_path / "rollout-0.log")
    assert started[-1] == ("rollout-0", tmp_path / "rollout-0.log", None)
    assert rank_log(tmp_path / "trainer.log", 0) == tmp_path / "trainer.log"
